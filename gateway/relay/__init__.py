"""The relay layer: everything between a downstream request and its upstream server.

`forward` sends every request that goes upstream (tools, prompts, resources, completions, tasks);
`context.CallContext` is what a request carries there; `asks` routes what a server asks of the user
and its log lines to the caller, `callers` is that caller on the SDK's server, `held` keeps a
2025-era server's questions open for a 2026-era caller, `rounds` asks a 2025-era caller a 2026-era
server's questions and the gateway's own confirmations, and `progress` passes progress notices on.
"""
