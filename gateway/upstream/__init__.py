"""The client side. What the registry holds under a server's name is an `UpstreamServer` (`server.py`): a
connection the gateway dials (`connection.py`, its calls in `invoke.py`, its offers in `offers.py`) or the
workers that dialled in under that name (`workerpool.py`). Transports are under `transports/`; beside them,
OAuth tokens toward servers, the sandbox stdio servers run in, and 2025-era sessions kept for callers who
are asked things (`legacy.py`)."""
