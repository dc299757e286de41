"""Process settings: CLI over MANIFOLD_* env over the config file over defaults."""

import os
from pathlib import Path

import pytest

from gateway.config.servers import ConfigError
from gateway.config.settings import DEFAULT_CONFIG, FILE_KEYS, build_settings, config_path, load


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith("MANIFOLD_"):
            monkeypatch.delenv(key)


def test_file_keys():
    expected = {
        "host",
        "port",
        "public_url",
        "allowed_hosts",
        "allowed_origins",
        "log_level",
        "log_format",
        "drain_timeout",
        "metrics_port",
        "admin_token",
        "confirm_key",
        "endpoints",
        "max_conversation_instances",
        "store",
        "reconcile_interval",
        "runtime",
        "credentials",
        "oauth_key",
        "auth",
        "allow_unauthenticated",
        "max_body_bytes",
        "max_json_depth",
        "max_header_bytes",
        "max_token_bytes",
        "header_timeout",
        "body_timeout",
        "keep_alive_timeout",
        "max_connections",
        "max_sessions",
        "session_idle_timeout",
        "fast_path",
        "exposure",
        "search_model",
        "workers",
        "handover",
        "sandbox",
        "tracing",
        "audit",
    }
    assert frozenset(expected) == FILE_KEYS


def test_defaults():
    s = build_settings({}, {})
    assert s.config == DEFAULT_CONFIG == Path("config/manifold.yaml")
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert (s.allowed_hosts, s.allowed_origins) == ([], [])
    assert (s.log_level, s.log_format) == ("info", "auto")


def test_http_limits_have_bounded_defaults():
    s = build_settings({}, {})
    assert (s.max_header_bytes, s.max_token_bytes, s.max_connections) == (32 * 1024, 16 * 1024, 4096)
    assert (s.header_timeout, s.body_timeout, s.keep_alive_timeout) == (10.0, 60.0, 75)
    assert s.max_token_bytes < s.max_header_bytes, "a token that fits the head is bounded on its own"


def test_file_over_defaults():
    s = build_settings({}, {"host": "0.0.0.0", "port": 9000, "log_level": "debug"})
    assert (s.host, s.port, s.log_level) == ("0.0.0.0", 9000, "debug")
    assert s.log_format == "auto"


def test_env_over_file(monkeypatch):
    monkeypatch.setenv("MANIFOLD_PORT", "9100")
    monkeypatch.setenv("MANIFOLD_HOST", "10.0.0.1")
    s = build_settings({}, {"host": "0.0.0.0", "port": 9000, "log_level": "debug"})
    assert (s.host, s.port, s.log_level) == ("10.0.0.1", 9100, "debug")


def test_cli_over_env_over_file(monkeypatch):
    monkeypatch.setenv("MANIFOLD_PORT", "9100")
    monkeypatch.setenv("MANIFOLD_HOST", "10.0.0.1")
    s = build_settings({"port": 9200}, {"host": "0.0.0.0", "port": 9000})
    assert s.port == 9200
    assert s.host == "10.0.0.1"


def test_cli_over_file_without_env():
    assert build_settings({"host": "h"}, {"host": "f"}).host == "h"


def test_env_comma_list(monkeypatch):
    monkeypatch.setenv("MANIFOLD_ALLOWED_HOSTS", "gw:8080, localhost ,,")
    s = build_settings({}, {"allowed_hosts": ["from-file"]})
    assert s.allowed_hosts == ["gw:8080", "localhost"]


def test_file_list_and_comma_string():
    assert build_settings({}, {"allowed_origins": ["http://a", "http://b"]}).allowed_origins == [
        "http://a",
        "http://b",
    ]
    assert build_settings({}, {"allowed_origins": "http://a,http://b"}).allowed_origins == [
        "http://a",
        "http://b",
    ]


def test_bad_values_raise_config_error_with_place(monkeypatch):
    with pytest.raises(ConfigError) as info:
        build_settings({"port": 70000}, {})
    assert info.value.problems == ["port: Input should be less than or equal to 65535"]

    with pytest.raises(ConfigError) as info:
        build_settings({}, {"log_level": "loud"})
    assert info.value.problems == ["log_level: Input should be 'debug', 'info', 'warning' or 'error'"]

    monkeypatch.setenv("MANIFOLD_PORT", "abc")
    with pytest.raises(ConfigError) as info:
        build_settings({}, {})
    assert [p.split(":")[0] for p in info.value.problems] == ["port"]


def test_the_egress_rules_cannot_be_turned_off():
    with pytest.raises(ConfigError) as info:
        build_settings({}, {"runtime": {"egress": {"enabled": False}}})
    [problem] = info.value.problems
    assert problem.startswith("runtime.egress.enabled:") and "runtime.egress.allow" in problem
    assert "runtime.stdio" in problem
    assert build_settings({}, {"runtime": {"egress": {"enabled": True}}}).runtime.egress.enabled is True


def test_cli_value_fixes_a_bad_env_value(monkeypatch):
    monkeypatch.setenv("MANIFOLD_LOG_LEVEL", "warning")
    assert build_settings({"log_level": "error"}, {"log_level": "debug"}).log_level == "error"


def test_config_path_precedence(monkeypatch):
    assert config_path({}, {}) == DEFAULT_CONFIG
    assert config_path({}, {"MANIFOLD_CONFIG": "env.yaml"}) == Path("env.yaml")
    assert config_path({"config": "cli.yaml"}, {"MANIFOLD_CONFIG": "env.yaml"}) == Path("cli.yaml")
    assert config_path({"config": None}, {"MANIFOLD_CONFIG": "env.yaml"}) == Path("env.yaml")
    assert config_path({}, {"MANIFOLD_CONFIG": ""}) == DEFAULT_CONFIG


def test_load_reads_file_settings_and_servers(tmp_path, monkeypatch):
    path = tmp_path / "m.yaml"
    path.write_text("host: 0.0.0.0\nport: 9000\nservers:\n  t:\n    command: mcp-server-time\n")
    monkeypatch.setenv("MANIFOLD_PORT", "9100")
    settings, file = load({"config": str(path), "host": None, "port": None})
    assert settings.config == path
    assert (settings.host, settings.port) == ("0.0.0.0", 9100)
    assert [s.name for s in file.servers] == ["t"]
    assert file.settings == {"host": "0.0.0.0", "port": 9000}

    settings, _ = load({"config": str(path), "port": 9300})
    assert settings.port == 9300


def test_load_uses_manifold_config_env(tmp_path, monkeypatch):
    path = tmp_path / "env.yaml"
    path.write_text("log_level: debug\n")
    monkeypatch.setenv("MANIFOLD_CONFIG", str(path))
    settings, file = load({})
    assert settings.config == path
    assert settings.log_level == "debug"
    assert file.servers == []


def test_load_rejects_unknown_file_keys(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("prot: 9000\n")
    with pytest.raises(ConfigError) as info:
        load({"config": str(path)})
    assert info.value.problems[0].startswith("prot: unknown key")


def test_tracing_and_audit_blocks(tmp_path, monkeypatch):
    path = tmp_path / "m.yaml"
    path.write_text(
        "tracing:\n  endpoint: http://127.0.0.1:4318\n  headers: {x-key: '${COLLECTOR_KEY}'}\n"
        "  sampler: parentbased_traceidratio\n  sampler_arg: 0.01\n"
        "audit: {enabled: true, path: /var/log/manifold/audit.jsonl, digest_key: '${AUDIT_KEY}'}\n"
    )
    monkeypatch.setenv("COLLECTOR_KEY", "collector-secret")
    monkeypatch.setenv("AUDIT_KEY", "k" * 32)
    settings, _ = load({"config": str(path)})
    assert settings.tracing.headers == {"x-key": "collector-secret"}
    assert settings.tracing.sampler == "parentbased_traceidratio" and settings.tracing.sampler_arg == 0.01
    assert settings.audit.enabled and settings.audit.digest_key is not None
    assert settings.audit.digest_key.get_secret_value() == "k" * 32
    assert "k" * 32 not in repr(settings.audit)
    # off by default
    assert build_settings({}, {}).tracing.enabled is None and not build_settings({}, {}).audit.enabled


def test_tracing_and_audit_problems_have_places(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_VAR", raising=False)
    path = tmp_path / "m.yaml"
    path.write_text(
        "tracing: {endpoint: 'ftp://x', sampler: sometimes, sampler_arg: 2, colour: red}\n"
        "audit: {queue: 0, digest_key: short}\n"
    )
    with pytest.raises(ConfigError) as info:
        load({"config": str(path)})
    places = {p.split(":")[0] for p in info.value.problems}
    assert {"tracing.endpoint", "tracing.sampler", "tracing.sampler_arg", "tracing.colour"} <= places
    assert {"audit.queue", "audit.digest_key"} <= places
    path.write_text("tracing: {headers: {x-key: '${NO_SUCH_VAR}'}}\n")
    with pytest.raises(ConfigError) as info:
        load({"config": str(path)})
    assert info.value.problems[0].startswith("tracing.headers: ") and "NO_SUCH_VAR" in info.value.problems[0]
