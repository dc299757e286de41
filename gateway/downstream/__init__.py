"""The server side: the one streamable HTTP endpoint (the SDK's server and its handlers by method family,
the fast path for plain calls, sessions, the gate of tokens and OAuth), and the endpoint workers dial in to."""
