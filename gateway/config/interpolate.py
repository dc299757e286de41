"""`${NAME}` and `${NAME:-default}` substitution from the environment."""

from __future__ import annotations

import re
from collections.abc import Mapping

_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class MissingVariable(Exception):
    """A `${NAME}` with no default whose variable is not set."""

    def __init__(self, name: str) -> None:
        super().__init__(f"environment variable {name} is not set")
        self.name = name


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """Fill every `${NAME}` and `${NAME:-default}` in `text`; `MissingVariable` names the first unset one."""

    def fill(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = environ.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                raise MissingVariable(name)
            return default
        return value

    return _PATTERN.sub(fill, text)
