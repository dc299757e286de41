"""Process settings: CLI flags over `MANIFOLD_*` environment over the config file over defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from gateway.config.access import ENDPOINT_NAME, LOOPBACK_HOSTS, AuthConfig, EndpointSpec, Exposure
from gateway.config.credentials import Credential
from gateway.config.interpolate import MissingVariable, interpolate
from gateway.config.servers import ConfigError, FileConfig, Sandbox, SandboxSpec, load_config
from gateway.observe.tracing import TraceSampler

DEFAULT_CONFIG = Path("config/manifold.yaml")
LogFormat = Literal["auto", "json", "console"]
CommaList = Annotated[list[str], NoDecode]

SearchModel = Literal["none", "wordllama", "minilm"]  # the `search_model` setting: lexical alone, or fused with a model


class EgressSettings(BaseModel):
    """Where servers not read from the config file (runtime, handed over) may connect: the egress rules always
    apply to them; `allow` lists host names and CIDRs they may reach anyway."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None  # accepted as true only: the rules cannot be turned off
    allow: list[str] = Field(default_factory=list)

    @field_validator("enabled")
    @classmethod
    def _always(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError(
                "the egress rules always apply to servers not read from the config file; list what they may reach "
                "anyway under runtime.egress.allow (e.g. 127.0.0.0/8), and set runtime.stdio: true to add stdio "
                "servers through the admin API"
            )
        return value


class RuntimeSettings(BaseModel):
    """Rules for servers added through the admin API."""

    model_config = ConfigDict(extra="forbid")

    egress: EgressSettings = Field(default_factory=EgressSettings)
    stdio: bool = False  # admin-API servers may be stdio commands (a program the gateway host runs)


class HandoverSettings(BaseModel):
    """Limits of the servers conversations hand over (`manifold/servers/add`, see `gateway/core/handover.py`)."""

    model_config = ConfigDict(extra="forbid")

    max_per_request: int = Field(default=16, ge=1, description="servers one manifold/servers/add may name")
    max_per_conversation: int = Field(default=16, ge=1, description="handed-over servers one conversation runs")
    max_per_token: int = Field(default=64, ge=1, description="handed-over servers one token's conversations run")


class WorkerSettings(BaseModel):
    """Limits of the workers that dial in at `/workers` to offer tools (see `gateway/upstream/workerpool.py`)."""

    model_config = ConfigDict(extra="forbid")

    max_tools: int = Field(default=500, ge=1, description="tools one worker may offer")
    heartbeat_interval: float = Field(default=2.0, gt=0, description="seconds between pings to each worker")
    heartbeat_timeout: float = Field(default=5.0, gt=0, description="seconds a worker has to answer a ping")
    send_queue: int = Field(default=64, ge=1, description="messages queued for one worker before its callers wait")
    send_timeout: float = Field(default=30.0, gt=0, description="seconds one message to a worker may take to send")
    timeout: float = Field(default=60.0, gt=0, description="seconds a call may go without an answer or progress")
    max_concurrent: int = Field(default=32, ge=1, description="calls in flight to one worker")
    max_queued: int = Field(default=64, ge=0, description="calls waiting for a slot of one worker")
    max_names_per_token: int = Field(default=32, ge=1, description="names one token's workers may offer at once")
    forget_after: float = Field(
        default=7 * 86400, gt=0, description="seconds after its last worker left that a name's series and pins go"
    )
    max_departed: int = Field(default=1000, ge=0, description="departed names remembered; the longest gone go first")


class TracingSettings(BaseModel):
    """The `tracing:` block: OpenTelemetry traces over OTLP/HTTP (see `gateway/observe/tracing.py`). Every key is
    optional; the standard OTEL_* variables win over it, and set alone they turn tracing on."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None  # None: on when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT or OTEL_TRACES_EXPORTER=otlp
    endpoint: str | None = None  # the OTLP/HTTP receiver (`/v1/traces` is added), e.g. http://collector:4318
    headers: dict[str, str] = Field(default_factory=dict)  # sent with each export; `${VAR}` is filled in
    service_name: str | None = None  # default `manifold`
    sampler: TraceSampler | None = None  # default parentbased_always_on
    sampler_arg: float | None = Field(default=None, ge=0, le=1)  # the ratio of the *traceidratio samplers
    timeout: float | None = Field(default=None, gt=0)  # seconds one export may take

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
            raise ValueError("expected the http(s) URL of an OTLP/HTTP receiver, e.g. http://127.0.0.1:4318")
        return value


class AuditSettings(BaseModel):
    """The `audit:` block: one JSON line per tool call and per administrative act (`gateway/observe/audit.py`)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    path: str = "-"  # a file, appended to (created 0600), or "-" for stdout
    queue: int = Field(default=10_000, ge=1)  # records waiting for the writer; beyond, new ones are dropped and counted
    digest_key: SecretStr | None = Field(default=None, min_length=16)  # keys the arguments' digest (HMAC-SHA256)


class Settings(BaseSettings):
    """How the process runs. Every field can also be set in the config file or as `MANIFOLD_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="MANIFOLD_", extra="forbid")

    config: Path = DEFAULT_CONFIG
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    public_url: str | None = None
    allowed_hosts: CommaList = Field(default_factory=list)
    allowed_origins: CommaList = Field(default_factory=list)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: LogFormat = "auto"
    drain_timeout: float = Field(10.0, ge=0)
    metrics_port: int | None = Field(None, ge=1, le=65535)
    admin_token: SecretStr | None = None
    confirm_key: SecretStr | None = Field(None, min_length=16)
    store: SecretStr | None = None
    reconcile_interval: float = Field(60.0, gt=0)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    credentials: dict[str, Credential] = Field(default_factory=dict)
    oauth_key: SecretStr | None = None
    auth: AuthConfig = Field(default_factory=AuthConfig)
    endpoints: dict[Annotated[str, StringConstraints(pattern=ENDPOINT_NAME)], EndpointSpec] = Field(
        default_factory=dict
    )
    allow_unauthenticated: bool = False
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_json_depth: int = Field(64, ge=4)
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    max_token_bytes: int = Field(16 * 1024, ge=256)
    header_timeout: float = Field(10.0, gt=0)
    body_timeout: float = Field(60.0, gt=0)
    # Above the idle timeouts of common balancers (60 s), so the balancer closes an idle connection first.
    keep_alive_timeout: int = Field(75, ge=1)
    max_connections: int = Field(4096, ge=1)
    max_sessions: int = Field(5000, ge=1)
    session_idle_timeout: float = Field(1800.0, gt=0)
    max_conversation_instances: int = Field(256, ge=1)
    handover: HandoverSettings = Field(default_factory=HandoverSettings)
    exposure: Exposure = "direct"
    search_model: SearchModel = "none"  # "minilm" or "wordllama": fuse the tool search with that extra's model
    fast_path: bool = True
    workers: WorkerSettings = Field(default_factory=WorkerSettings)
    sandbox: Annotated[Sandbox, NoDecode] = Field(default_factory=SandboxSpec)  # stdio servers' default policy
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)

    @property
    def resource_url(self) -> str:
        """The gateway's `/mcp` URL as its clients reach it: `public_url` + `/mcp`, else (on loopback) the bound
        address. It names the gateway as an OAuth protected resource (RFC 8707, RFC 9728)."""
        if self.public_url is not None:
            return f"{self.public_url}/mcp"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/mcp"

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("oauth_key")
    @classmethod
    def _oauth_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError("at least 32 characters, please (e.g. the output of `openssl rand -base64 32`)")
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"expected the http(s) URL clients reach the gateway at, without query, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _oauth_resource(self) -> Settings:
        loopback = self.host in LOOPBACK_HOSTS or self.host.startswith("127.")
        if self.auth.oauth is not None and self.public_url is None and not loopback:
            raise ValueError(
                "public_url: auth.oauth needs the URL clients reach the gateway at (e.g. https://gateway.example.com): "
                "it names the gateway to the authorization server and in its protected resource metadata"
            )
        return self

    @model_validator(mode="after")
    def _oauth_storage(self) -> Settings:
        store = self.store.get_secret_value() if self.store is not None else ""
        for name, credential in self.credentials.items():
            if credential.oauth is None or credential.oauth.grant != "refresh_token":
                continue
            if self.oauth_key is None:
                raise ValueError(
                    f"credentials.{name}.oauth.grant: refresh_token needs `oauth_key` (or MANIFOLD_OAUTH_KEY): "
                    "refresh tokens are only ever stored encrypted"
                )
            if not store.startswith(("sqlite:///", "redis://", "rediss://", "unix://")):
                raise ValueError(
                    f"credentials.{name}.oauth.grant: refresh_token needs a `store` (sqlite:///... or redis://...): "
                    "`manifold auth login` puts the refresh token there for the gateway to read"
                )
        return self


FILE_KEYS = frozenset(Settings.model_fields) - {"config"}


def config_path(cli: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Path:
    """The config file to read: `--config`, else `MANIFOLD_CONFIG`, else `config/manifold.yaml`."""
    if cli.get("config"):
        return Path(cli["config"])
    return Path(environ.get("MANIFOLD_CONFIG") or DEFAULT_CONFIG)


def load(cli: Mapping[str, Any]) -> tuple[Settings, FileConfig]:
    """Read the config file and build the settings; `ConfigError` lists every problem with its place."""
    path = config_path(cli)
    file = load_config(path, FILE_KEYS)
    overrides = {k: v for k, v in cli.items() if v is not None}
    overrides["config"] = path
    return build_settings(overrides, _fill(file.settings)), file


def _fill(values: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """`${VAR}` in the file's `admin_token`, `store`, `confirm_key`, `oauth_key`, token secrets, `tracing.headers`
    and `audit.digest_key` (credentials are filled when used)."""
    filled = dict(values)
    problems = []
    for key in ("admin_token", "store", "confirm_key", "oauth_key"):
        if isinstance(filled.get(key), str):
            try:
                filled[key] = interpolate(filled[key], environ)
            except MissingVariable as e:
                problems.append(f"{key}: {e}")
    for block, keys in (("tracing", ("headers",)), ("audit", ("digest_key",))):
        section = filled.get(block)
        for key in keys:
            value = section.get(key) if isinstance(section, dict) else None
            try:
                if isinstance(value, str):
                    filled[block] = section = {**section, key: interpolate(value, environ)}  # type: ignore[dict-item]
                elif isinstance(value, dict):
                    values = {k: interpolate(v, environ) if isinstance(v, str) else v for k, v in value.items()}
                    filled[block] = section = {**section, key: values}  # type: ignore[dict-item]
            except MissingVariable as e:
                problems.append(f"{block}.{key}: {e}")
    auth = filled.get("auth")
    if isinstance(auth, dict) and isinstance(auth.get("tokens"), list):
        tokens = []
        for i, token in enumerate(auth["tokens"]):
            if isinstance(token, dict) and isinstance(token.get("token"), str):
                try:
                    token = {**token, "token": interpolate(token["token"], environ)}
                except MissingVariable as e:
                    problems.append(f"auth.tokens[{i}].token: {e}")
            tokens.append(token)
        filled["auth"] = {**auth, "tokens": tokens}
    if problems:
        raise ConfigError(problems)
    return filled


def build_settings(cli: Mapping[str, Any], file_values: Mapping[str, Any]) -> Settings:
    """Settings from CLI values, the environment and the config file's values, in that order."""

    class _Layered(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, InitSettingsSource(settings_cls, dict(file_values))

    try:
        return _Layered(**cli)
    except ValidationError as e:
        raise ConfigError([_problem(err) for err in e.errors()]) from None


def _problem(err: Any) -> str:
    """One validation error as `place: message`; a whole-settings check names its own place."""
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    place = ".".join(str(p) for p in err["loc"])
    return f"{place}: {message}" if place else message
