"""Process settings: CLI flags over `MANIFOLD_*` environment over the config file over defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from gateway.config import ConfigError, FileConfig, load_config

DEFAULT_CONFIG = Path("config/manifold.yaml")
LogFormat = Literal["auto", "json", "console"]
CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """How the process runs. Every field can also be set in the config file or as `MANIFOLD_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="MANIFOLD_", extra="forbid")

    config: Path = DEFAULT_CONFIG
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    allowed_hosts: CommaList = Field(default_factory=list)
    allowed_origins: CommaList = Field(default_factory=list)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: LogFormat = "auto"
    drain_timeout: float = Field(10.0, ge=0)
    metrics_port: int | None = Field(None, ge=1, le=65535)

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


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
    return build_settings(overrides, file.settings), file


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
        raise ConfigError(
            [f"{'.'.join(str(p) for p in err['loc']) or '(settings)'}: {err['msg']}" for err in e.errors()]
        ) from None
