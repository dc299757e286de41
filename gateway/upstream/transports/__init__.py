"""How bytes reach a server: stdio (a child process), the SDK's streamable HTTP and legacy SSE clients,
the lean HTTP/1.1 client beside them, and the reshaping of lenient answers."""
