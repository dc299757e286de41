"""What passes between a caller and a server besides the request itself.

`context.CallContext` is what a request carries upstream (sent by `gateway.core.forward`); `asks` routes what
a server asks of the user and its log lines to the caller, `callers` is that caller on the SDK's server,
`held` keeps a 2025-era server's questions open for a 2026-era caller, `rounds` asks a 2025-era caller a
2026-era server's questions and the gateway's own confirmations, and `progress` passes progress notices on.
"""
