"""uvicorn's private names."""

from __future__ import annotations

import uvicorn


def keep_exit_status_clean(server: uvicorn.Server) -> None:
    """Forget the signals uvicorn caught, so it exits 0 after a drain instead of re-raising SIGTERM."""
    server._captured_signals.clear()


async def _no_app(scope: object, receive: object, send: object) -> None:
    return None


SYMBOLS = {"uvicorn.Server._captured_signals": lambda: uvicorn.Server(uvicorn.Config(app=_no_app))._captured_signals}
