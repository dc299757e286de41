"""The console's sign-in: the admin token buys a session kept in this process, named by a cookie; every POST
carries the session's CSRF token (the sign-in form, which has no session yet, a one-off token in a cookie of its
own). Cookies are HttpOnly, SameSite=Strict, scoped to the console's path, and Secure when the request came
over TLS. The token itself is compared and forgotten: it is never stored, set in a cookie or shown."""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

PREFIX = "/admin/ui"
COOKIE = "manifold_console"
SIGN_IN_COOKIE = "manifold_console_sign_in"
LIFETIME = 8 * 3600.0
SIGN_IN_LIFETIME = 3600
MAX_SESSIONS = 256


@dataclass(frozen=True, slots=True)
class Session:
    """One signed-in browser."""

    id: str
    csrf: str
    expires: float


def same(given: str, expected: str) -> bool:
    """Whether two secrets are equal, in time that does not depend on where they differ."""
    return hmac.compare_digest(given.encode(), expected.encode())


class Sessions:
    """The sessions of this process (a restart signs everyone out), at most `MAX_SESSIONS`: the oldest goes
    first."""

    def __init__(self, token: str, lifetime: float = LIFETIME) -> None:
        self._token = token
        self._lifetime = lifetime
        self._live: dict[str, Session] = {}

    def token_matches(self, given: str) -> bool:
        """Whether `given` is the admin token."""
        return same(given, self._token)

    def open(self) -> Session:
        """A new session (a fresh id at every sign-in)."""
        self._prune()
        while len(self._live) >= MAX_SESSIONS:
            del self._live[next(iter(self._live))]
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), time.time() + self._lifetime)
        self._live[session.id] = session
        return session

    def find(self, request: Request) -> Session | None:
        """The live session the request's cookie names, if any."""
        return self.get(request.cookies.get(COOKIE, ""))

    def get(self, session_id: str) -> Session | None:
        """The live session with this id, if any."""
        session = self._live.get(session_id)
        if session is None:
            return None
        if session.expires <= time.time():
            del self._live[session_id]
            return None
        return session

    def close(self, session: Session) -> None:
        """End a session (sign-out)."""
        self._live.pop(session.id, None)

    def _prune(self) -> None:
        now = time.time()
        for key in [k for k, s in self._live.items() if s.expires <= now]:
            del self._live[key]


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    """Set one of the console's cookies: HttpOnly, SameSite=Strict, its path only, Secure over TLS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PREFIX,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def clear_cookie(response: Response, request: Request, name: str) -> None:
    """Remove one of the console's cookies."""
    response.delete_cookie(name, path=PREFIX, secure=request.url.scheme == "https", httponly=True, samesite="strict")


def sign_in_token(request: Request) -> str:
    """The sign-in form's CSRF token: the one its cookie already holds, else a new one (set it with
    `set_cookie`)."""
    current = request.cookies.get(SIGN_IN_COOKIE, "")
    return current if 20 <= len(current) <= 100 else secrets.token_urlsafe(32)
