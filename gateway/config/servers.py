"""The config file: upstream servers (`ServerSpec`) and process settings, in either file shape.

Two shapes are accepted: Manifold's own YAML (`servers:`) and the Claude Desktop / Cursor
`mcpServers` JSON (as a standalone `.json` file or under an `mcpServers:` key in the YAML).
Every problem is collected with its place (`servers.github.url: ...`) and reported at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from gateway.config.credentials import OAuthParams, fill_oauth, use_problems
from gateway.config.interpolate import MissingVariable, interpolate
from gateway.protocol.era import Protocol
from gateway.protocol.naming import reserved_problem, sanitise


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number of seconds, got a boolean")
    return value


Transport = Literal["stdio", "http", "sse", "worker"]  # `worker`: offered by workers that dial in, never in a file
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False), BeforeValidator(_no_bool)]

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TRANSPORT_ALIASES: dict[str, Transport] = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamable_http": "http",
    "streamableHttp": "http",
    "sse": "sse",
}
_SERVER_SECTIONS = ("servers", "mcpServers")


class ConfigError(Exception):
    """The config cannot be used; `problems` lists each one with its place."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class RetrySpec(BaseModel):
    """Retries of read-only and idempotent tools after a transient failure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempts: int = Field(3, ge=1, le=20)
    initial_delay: Seconds = 0.1
    max_delay: Seconds = 5.0


class RelaySpec(BaseModel):
    """Which requests a server may make of the user through the gateway (sampling, elicitation, roots).

    Roots are off unless the server opts in: some servers (server-filesystem) replace their sandbox
    with the roots a client lists, so relaying a client's roots can widen what the server may touch.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sampling: bool = True
    elicitation: bool = True
    roots: bool = False


def _switch(value: Any) -> Any:
    """`sandbox: off` (YAML reads it as false) or `on`, as the mapping it stands for; a JSON object in a string (an
    environment variable) as that object."""
    if value is False or value == "off":
        return {"enabled": False}
    if value is True or value == "on":
        return {"enabled": True}
    if isinstance(value, str) and value.lstrip().startswith("{"):
        return json.loads(value)
    return value


def _absolute(paths: list[str]) -> list[str]:
    for path in paths:
        if not path.startswith(("/", "~/")):
            raise ValueError(f"{path!r} is neither an absolute path nor one under ~/ (the gateway's HOME)")
        if path.rstrip("/") in ("", "~"):
            raise ValueError(f"granting {path} is no sandbox at all; say `sandbox: off` instead")
    return [path.rstrip("/") for path in paths]


class SandboxSpec(BaseModel):
    """How a stdio server is confined (see `gateway/upstream/sandbox.py`): what it may read and write, its network,
    its limits. A server's own fields take the place of the process-wide default's, but `read` and `write` add to
    them. `memory` and `file_size` take bytes or sizes such as `512MiB`; `null` lifts a limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    read: Annotated[list[str], AfterValidator(_absolute)] = Field(default_factory=list)
    write: Annotated[list[str], AfterValidator(_absolute)] = Field(default_factory=list)
    network: Literal["none", "all"] = "none"
    memory: ByteSize | None = ByteSize(2 * 1024**3)
    cpu_time: Seconds | None = None
    processes: int | None = Field(default=256, ge=1)
    file_size: ByteSize | None = None
    scripts: bool = True  # programs and scripts (.py, .js...) that `args` name are made readable with their packages

    def over(self, default: SandboxSpec) -> SandboxSpec:
        """This server's policy on top of the process-wide `default`."""
        fields = {name: getattr(self, name) for name in self.model_fields_set}
        fields["read"] = [*default.read, *self.read]
        fields["write"] = [*default.write, *self.write]
        return default.model_copy(update=fields)


Sandbox = Annotated[SandboxSpec, BeforeValidator(_switch)]


class ToolOverride(BaseModel):
    """What the operator says of one tool instead of its server: a new name, title, description or annotations."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, min_length=1, max_length=64)
    title: str | None = None
    description: str | None = None
    annotations: dict[str, Any] | None = None
    always: bool = False  # listed even when the gateway's exposure is deferred

    @model_validator(mode="after")
    def _known_hints(self) -> ToolOverride:
        known = {"title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}
        unknown = set(self.annotations or {}) - known
        if unknown:
            raise ValueError(f"unknown annotations {sorted(unknown)}; known: {sorted(known)}")
        return self


PinMode = Literal["off", "warn", "hold"]
Isolation = Literal["shared", "conversation"]


class ServerSpec(BaseModel):
    """One upstream server's options, as written in the config (before `${VAR}` filling)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    transport: Transport | None = None
    only: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    trusted: bool = False
    gated: bool | None = None
    prefix: str | None = None
    timeout: Seconds = 60.0
    startup_timeout: Seconds = 10.0
    max_call_time: Seconds | None = None
    max_concurrent: int = Field(128, ge=1)
    max_queued: int = Field(512, ge=0)
    retry: RetrySpec = RetrySpec.model_validate({})
    refresh_interval: Seconds | None = None
    required: bool = False
    credential: str | None = None
    forward_headers: list[str] = Field(default_factory=list)
    disabled: bool = False
    relay: RelaySpec = RelaySpec.model_validate({})
    protocol: Protocol = "auto"
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    isolation: Isolation = "shared"
    idle_timeout: Seconds = 300.0
    max_instances: int = Field(64, ge=1)
    pin: PinMode | None = None
    sandbox: Sandbox | None = None  # None: the process-wide `sandbox` setting

    @model_validator(mode="after")
    def _check(self) -> ServerSpec:
        if (why := reserved_problem(self.name, self.prefix)) is not None:
            raise ValueError(why)
        if self.transport == "worker":
            if self.command is not None or self.url is not None:
                raise ValueError("a server offered by workers has neither `command` nor `url`")
            return self
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) or `url` (HTTP)")
        if self.command is not None and self.transport not in (None, "stdio"):
            raise ValueError(f"`command` means stdio, but the transport says {self.transport!r}")
        if self.url is not None:
            if self.transport == "stdio":
                raise ValueError("`url` means HTTP, but the transport says 'stdio'")
            if not re.match(r"^(https?://|\$\{)", self.url):
                raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.command is not None and not self.command.strip():
            raise ValueError("`command` is empty")
        if self.sandbox is not None and self.command is None:
            raise ValueError("`sandbox` applies to stdio servers only (a `command`)")
        if self.forward_headers and self.command is not None:
            raise ValueError("`forward_headers` applies to HTTP servers only")
        for header in self.forward_headers:
            if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", header):
                raise ValueError(f"forward_headers: {header!r} is not a header name (exact names, no globs)")
        return self

    @property
    def kind(self) -> Transport:
        """The transport this server uses."""
        if self.command is not None:
            return "stdio"
        return self.transport or "http"

    @property
    def pin_mode(self) -> PinMode:
        """`pin`, or by default `hold` for a server that is not trusted and `off` for one that is."""
        if self.pin is not None:
            return self.pin
        return "off" if self.trusted else "hold"

    @property
    def effective_prefix(self) -> str:
        """The sanitised prefix of its public tool names ("" for bare names)."""
        return sanitise(self.name if self.prefix is None else self.prefix)


@dataclass(frozen=True)
class ResolvedServer:
    """A server's connection options with every `${VAR}` filled in. Holds secrets: never log it."""

    command: str | None
    args: list[str]
    env: dict[str, str]
    cwd: str | None
    url: str | None
    headers: dict[str, str]
    oauth: OAuthParams | None = None  # the server's access tokens come from this OAuth client


def resolve(
    spec: ServerSpec, environ: Mapping[str, str], credentials: Mapping[str, Any] | None = None
) -> ResolvedServer:
    """Fill `${VAR}` in url, headers, env and args, adding the named credential's headers and env (or, for an
    OAuth credential, the client to get the server's access tokens with).

    `ConfigError` names each unset variable (or unknown or unusable credential) and its place, never a value.
    """
    problems = missing_variables(spec, environ)
    extra_headers: dict[str, str] = {}
    extra_env: dict[str, str] = {}
    oauth = None
    url = interpolate(spec.url, environ) if spec.url is not None and not problems else spec.url
    if spec.credential is not None:
        credential = (credentials or {}).get(spec.credential)
        if credential is None:
            problems.append(f"credential: no credential named {spec.credential!r} in the gateway's config")
        elif credential.oauth is not None:
            problems += use_problems(spec, spec.credential, credential)
            oauth = fill_oauth(spec.credential, credential.oauth, url, environ, problems)
        else:
            for kind, target in (("headers", extra_headers), ("env", extra_env)):
                for key, text in getattr(credential, kind).items():
                    try:
                        target[key] = interpolate(text, environ)
                    except MissingVariable as e:
                        problems.append(f"credentials.{spec.credential}.{kind}.{key}: {e}")
    if problems:
        raise ConfigError(problems)
    return ResolvedServer(
        command=spec.command,
        args=[interpolate(a, environ) for a in spec.args],
        env={**extra_env, **{k: interpolate(v, environ) for k, v in spec.env.items()}},
        cwd=spec.cwd,
        url=url,
        headers={**extra_headers, **{k: interpolate(v, environ) for k, v in spec.headers.items()}},
        oauth=oauth,
    )


def missing_variables(spec: ServerSpec, environ: Mapping[str, str]) -> list[str]:
    """Each place whose `${VAR}` is unset, as `url: environment variable X is not set`."""
    places: list[tuple[str, str]] = [(f"args[{i}]", a) for i, a in enumerate(spec.args)]
    places += [(f"env.{k}", v) for k, v in spec.env.items()]
    places += [(f"headers.{k}", v) for k, v in spec.headers.items()]
    if spec.url is not None:
        places.append(("url", spec.url))
    out = []
    for place, text in places:
        try:
            interpolate(text, environ)
        except MissingVariable as e:
            out.append(f"{place}: {e}")
    return out


@dataclass
class FileConfig:
    """What a config file holds: its servers (sorted by name) and its process-setting keys."""

    servers: list[ServerSpec] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def load_config(path: Path, settings_keys: frozenset[str] = frozenset()) -> FileConfig:
    """Read and validate a config file (`.json` or YAML); raise `ConfigError` with every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read the config file ({e.strerror or e})"]) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError([f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}"]) from None
    return parse_config(data, settings_keys, foreign_keys_ok=path.suffix == ".json")


def parse_config(
    data: Any, settings_keys: frozenset[str] = frozenset(), *, foreign_keys_ok: bool = False
) -> FileConfig:
    """Validate already-parsed config data; raise `ConfigError` with every problem and its place.

    `foreign_keys_ok` ignores unknown top-level keys, as a pasted Claude Desktop JSON file has some.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"(top level): expected a mapping, got {type(data).__name__}"])
    problems: list[str] = []
    config = FileConfig()
    for key, value in data.items():
        if key in _SERVER_SECTIONS:
            continue
        if key in settings_keys:
            config.settings[key] = value
        elif not foreign_keys_ok:
            problems.append(f"{key}: unknown key (expected one of: {', '.join(_known_keys(settings_keys))})")
    seen: dict[str, str] = {}
    for section in _SERVER_SECTIONS:
        entries = data.get(section)
        if entries is None:
            continue
        if not isinstance(entries, dict):
            problems.append(f"{section}: expected a mapping of server names to options")
            continue
        for name, raw in entries.items():
            place = f"{section}.{name}"
            if str(name) in seen:
                problems.append(f"{place}: server {name!r} is also defined in {seen[str(name)]}")
                continue
            seen[str(name)] = section
            spec = parse_server(str(name), raw, place, problems)
            if spec is not None:
                config.servers.append(spec)
    problems += _prefix_clashes(config.servers, seen)
    if problems:
        raise ConfigError(problems)
    config.servers.sort(key=lambda s: s.name)
    return config


def _known_keys(settings_keys: frozenset[str]) -> list[str]:
    return [*_SERVER_SECTIONS, *sorted(settings_keys)]


def parse_server(name: str, raw: Any, place: str, problems: list[str]) -> ServerSpec | None:
    """Validate one server entry; append every problem found (with its place) and return None if any."""
    before = len(problems)
    if not NAME_PATTERN.fullmatch(name):
        problems.append(
            f"{place}: bad server name {name!r} (use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, at most 64 characters)"
        )
    if not isinstance(raw, dict):
        problems.append(f"{place}: expected a mapping of options, got {type(raw).__name__}")
        return None
    options = dict(raw)
    written = {"transport": "transport", "url": "url"}
    for alias, canonical in (("serverUrl", "url"), ("type", "transport")):
        if alias in options:
            if canonical in options:
                problems.append(f"{place}.{alias}: give either `{alias}` or `{canonical}`, not both")
            options[canonical] = options.pop(alias)
            written[canonical] = alias
    transport = options.get("transport")
    if transport is not None:
        if isinstance(transport, str) and transport in _TRANSPORT_ALIASES:
            options["transport"] = _TRANSPORT_ALIASES[transport]
        else:
            problems.append(
                f"{place}.{written['transport']}: unknown transport {transport!r} "
                "(expected stdio, http, streamable-http or sse)"
            )
            del options["transport"]
    if "name" in options:
        problems.append(f"{place}.name: unknown key (the server's name is its key in the mapping)")
        del options["name"]
    for key in ("only", "deny"):
        globs = options.get(key)
        if isinstance(globs, list):
            for i, glob in enumerate(globs):
                if (why := glob_problem(glob)) is not None:
                    problems.append(f"{place}.{key}[{i}]: {why}")
            options[key] = [g for g in globs if glob_problem(g) is None]
    try:
        spec = ServerSpec(name=name, **options)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(written.get(str(p), str(p)) for p in err["loc"])
            where = f"{place}.{loc}" if loc else place
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key"
            problems.append(f"{where}: {message}")
        return None
    return spec if len(problems) == before else None


def glob_problem(glob: Any) -> str | None:
    """Why `glob` is not a usable tool-name pattern, or None when it is."""
    if not isinstance(glob, str):
        return f"expected a tool name or glob (a string), got {type(glob).__name__}"
    if not glob:
        return "empty pattern"
    if any(c.isspace() or not c.isprintable() for c in glob):
        return f"pattern {glob!r} contains whitespace or control characters"
    i = 0
    while i < len(glob):
        if glob[i] == "[":
            j = i + 1
            if j < len(glob) and glob[j] == "!":
                j += 1
            if j < len(glob) and glob[j] == "]":
                j += 1
            close = glob.find("]", j)
            if close < 0:
                return f"pattern {glob!r} has an unclosed '['"
            i = close
        elif glob[i] == "]":
            return f"pattern {glob!r} has a ']' without '['"
        i += 1
    return None


def _prefix_clashes(servers: list[ServerSpec], sections: Mapping[str, str]) -> list[str]:
    owners: dict[str, str] = {}
    problems = []
    for spec in sorted(servers, key=lambda s: s.name):
        prefix = spec.effective_prefix
        if spec.disabled or prefix == "":
            continue
        if prefix in owners:
            place = f"{sections.get(spec.name, 'servers')}.{spec.name}.prefix"
            problems.append(f"{place}: prefix {prefix!r} is also used by server {owners[prefix]!r}")
        else:
            owners[prefix] = spec.name
    return problems
