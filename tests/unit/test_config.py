"""Config parsing (both file shapes), validation with places, and `${VAR}` interpolation."""

import json
import textwrap

import pytest
from pydantic import ValidationError

from gateway.config.interpolate import MissingVariable, interpolate
from gateway.config.servers import (
    ConfigError,
    ServerSpec,
    glob_problem,
    load_config,
    missing_variables,
    parse_config,
    resolve,
)
from gateway.config.settings import FILE_KEYS

ISSUE_YAML = """\
servers:
  time:                                   # the server's name, also its default prefix
    command: mcp-server-time              # `command` means stdio
    args: ["--local-timezone", "UTC"]
    env: {TZ: UTC}                        # merged over a minimal environment
    cwd: /srv                             # optional
  linear:
    url: https://mcp.linear.app/mcp       # `url` means streamable HTTP ...
    headers: {Authorization: "Bearer ${LINEAR_TOKEN}"}
    only: ["search_*", "create_issue"]    # allow list: exact names or shell globs, ORIGINAL names
    deny: ["*_delete"]                    # applied after `only`
    trusted: true                         # answers labelled trusted (default: outside)
    gated: false                          # overrides the read-only rule
    prefix: lin                           # optional; "" keeps names bare (a clash is a config error)
    timeout: 120                          # seconds per call (default 60)
    startup_timeout: 20                   # connect + negotiate + list (default 10)
  legacy:
    url: http://127.0.0.1:9000/sse
    transport: sse                        # ... unless `transport: sse` (legacy HTTP+SSE)
    disabled: true
"""

CLAUDE_JSON = {
    "mcpServers": {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
            "env": {"DEBUG": "1"},
        },
        "remote": {"url": "https://example.com/mcp", "headers": {"X-Key": "${KEY}"}},
        "windsurf": {"serverUrl": "https://example.org/mcp"},
        "cursor-http": {"type": "streamable-http", "url": "https://example.net/mcp"},
        "cursor-stdio": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]},
        "old": {"type": "sse", "url": "http://127.0.0.1:9000/sse", "disabled": True},
        "plain-http": {"type": "http", "url": "http://127.0.0.1:9001/mcp"},
    }
}


def _problems(data, settings_keys=frozenset()) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, settings_keys)
    return info.value.problems


def _one(**options) -> dict:
    return {"servers": {"x": options}}


# --- the documented YAML shape ---------------------------------------------------------------


def test_documented_yaml_shape(tmp_path):
    path = tmp_path / "manifold.yaml"
    path.write_text(ISSUE_YAML)
    config = load_config(path)
    assert [s.name for s in config.servers] == ["legacy", "linear", "time"]
    legacy, linear, time = config.servers

    assert time.kind == "stdio"
    assert time.command == "mcp-server-time"
    assert time.args == ["--local-timezone", "UTC"]
    assert time.env == {"TZ": "UTC"}
    assert time.cwd == "/srv"
    assert time.effective_prefix == "time"
    assert (time.timeout, time.startup_timeout) == (60.0, 10.0)
    assert (time.trusted, time.gated, time.only, time.deny, time.disabled) == (False, None, None, [], False)

    assert linear.kind == "http"
    assert linear.url == "https://mcp.linear.app/mcp"
    assert linear.headers == {"Authorization": "Bearer ${LINEAR_TOKEN}"}
    assert linear.only == ["search_*", "create_issue"]
    assert linear.deny == ["*_delete"]
    assert linear.trusted is True
    assert linear.gated is False
    assert linear.prefix == "lin"
    assert linear.effective_prefix == "lin"
    assert (linear.timeout, linear.startup_timeout) == (120.0, 20.0)

    assert legacy.kind == "sse"
    assert legacy.disabled is True
    assert config.settings == {}


def test_empty_file_is_an_empty_config(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    config = load_config(path)
    assert config.servers == []
    assert config.settings == {}


def test_server_spec_is_frozen_and_forbids_extra():
    spec = ServerSpec.model_validate({"name": "x", "command": "c"})
    with pytest.raises(ValidationError):
        spec.command = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        ServerSpec.model_validate({"name": "x", "command": "c", "comand": "c"})


# --- the Claude Desktop / Cursor shape ------------------------------------------------------


def _check_claude_servers(servers):
    by_name = {s.name: s for s in servers}
    assert list(by_name) == sorted(CLAUDE_JSON["mcpServers"])
    fs = by_name["filesystem"]
    assert (fs.kind, fs.command, fs.args, fs.env) == (
        "stdio",
        "npx",
        ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
        {"DEBUG": "1"},
    )
    assert (by_name["remote"].kind, by_name["remote"].headers) == ("http", {"X-Key": "${KEY}"})
    assert (by_name["windsurf"].kind, by_name["windsurf"].url) == ("http", "https://example.org/mcp")
    assert by_name["cursor-http"].kind == "http"
    assert by_name["cursor-stdio"].kind == "stdio"
    assert (by_name["old"].kind, by_name["old"].disabled) == ("sse", True)
    assert by_name["plain-http"].kind == "http"
    assert by_name["cursor-http"].effective_prefix == "cursor-http"


def test_mcp_servers_json_as_standalone_file(tmp_path):
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(CLAUDE_JSON, indent=2))
    _check_claude_servers(load_config(path).servers)


def test_mcp_servers_under_yaml_key(tmp_path):
    path = tmp_path / "manifold.yaml"
    path.write_text("mcpServers:\n" + textwrap.indent(json.dumps(CLAUDE_JSON["mcpServers"], indent=2), "  "))
    _check_claude_servers(load_config(path).servers)


def test_both_sections_together():
    config = parse_config({"servers": {"a": {"command": "a"}}, "mcpServers": {"b": {"url": "http://b"}}})
    assert [s.name for s in config.servers] == ["a", "b"]


@pytest.mark.parametrize(
    ("transport", "kind"),
    [("stdio", "stdio"), ("http", "http"), ("streamable-http", "http"), ("sse", "sse")],
)
def test_type_aliases(transport, kind):
    options = {"command": "c"} if kind == "stdio" else {"url": "http://h/mcp"}
    (spec,) = parse_config({"mcpServers": {"x": {"type": transport, **options}}}).servers
    assert spec.kind == kind


def test_transport_sse_in_yaml():
    (spec,) = parse_config(_one(url="http://127.0.0.1:9000/sse", transport="sse")).servers
    assert spec.kind == "sse"
    assert spec.transport == "sse"


def test_url_defaults_to_streamable_http():
    (spec,) = parse_config(_one(url="https://h/mcp")).servers
    assert spec.kind == "http"
    assert spec.transport is None


def test_url_may_start_with_a_variable():
    (spec,) = parse_config(_one(url="${BASE_URL}/mcp")).servers
    assert spec.url == "${BASE_URL}/mcp"


# --- errors, each with its place, all at once ------------------------------------------------


def test_unknown_server_key():
    assert _problems(_one(comand="x")) == ["servers.x.comand: unknown key"]


def test_unknown_key_under_mcp_servers():
    assert _problems({"mcpServers": {"x": {"command": "c", "evn": {}}}}) == ["mcpServers.x.evn: unknown key"]


def test_name_key_is_refused():
    problems = _problems(_one(command="c", name="y"))
    assert len(problems) == 1
    assert problems[0].startswith("servers.x.name: unknown key")


@pytest.mark.parametrize("options", [{"command": "c", "url": "http://h"}, {}, {"args": ["a"]}])
def test_exactly_one_of_command_and_url(options):
    assert _problems(_one(**options)) == ["servers.x: give exactly one of `command` (stdio) or `url` (HTTP)"]


def test_command_with_http_transport_is_an_error():
    (problem,) = _problems(_one(command="c", transport="http"))
    assert problem.startswith("servers.x: `command` means stdio")


def test_url_with_stdio_transport_is_an_error():
    (problem,) = _problems(_one(url="http://h", transport="stdio"))
    assert problem.startswith("servers.x: `url` means HTTP")


def test_url_scheme_checked():
    (problem,) = _problems(_one(url="ftp://h"))
    assert problem.startswith("servers.x: url must start with http:// or https://")


def test_empty_command_is_an_error():
    assert _problems(_one(command="  ")) == ["servers.x: `command` is empty"]


def test_unknown_transport():
    (problem,) = _problems(_one(url="http://h", transport="websocket"))
    assert problem.startswith("servers.x.transport: unknown transport 'websocket'")


def test_alias_and_canonical_together():
    (problem,) = _problems(_one(url="http://h", serverUrl="http://h"))
    assert problem.startswith("servers.x.serverUrl: give either `serverUrl` or `url`")


@pytest.mark.parametrize("name", ["bad name", "_x", "-x", ".x", "a/b", "x" * 65, "ünï"])
def test_bad_server_names(name):
    (problem,) = _problems({"servers": {name: {"command": "c"}}})
    assert problem.startswith(f"servers.{name}: bad server name {name!r}")


@pytest.mark.parametrize("name", ["x", "X9", "my.server", "a_b-c", "1", "x" * 64])
def test_good_server_names(name):
    assert [s.name for s in parse_config({"servers": {name: {"command": "c"}}}).servers] == [name]


def test_server_name_with_trailing_newline_is_bad():
    _problems({"servers": {"abc\n": {"command": "c"}}})


def test_server_options_must_be_a_mapping():
    assert _problems({"servers": {"x": "mcp-server-time"}}) == ["servers.x: expected a mapping of options, got str"]


def test_servers_section_must_be_a_mapping():
    assert _problems({"servers": ["x"]}) == ["servers: expected a mapping of server names to options"]


def test_top_level_must_be_a_mapping():
    assert _problems([1, 2]) == ["(top level): expected a mapping, got list"]


def test_bad_globs_each_reported_with_place():
    assert _problems(_one(command="c", only=["ok_*", "[abc", ""], deny=["a]", 3])) == [
        "servers.x.only[1]: pattern '[abc' has an unclosed '['",
        "servers.x.only[2]: empty pattern",
        "servers.x.deny[0]: pattern 'a]' has a ']' without '['",
        "servers.x.deny[1]: expected a tool name or glob (a string), got int",
    ]


def test_only_must_be_a_list():
    assert _problems(_one(command="c", only="search_*")) == ["servers.x.only: Input should be a valid list"]


@pytest.mark.parametrize("timeout", [0, -1, -0.5])
def test_bad_timeout(timeout):
    assert _problems(_one(command="c", timeout=timeout, startup_timeout=timeout)) == [
        "servers.x.timeout: Input should be greater than 0",
        "servers.x.startup_timeout: Input should be greater than 0",
    ]


def test_timeout_must_be_a_number():
    (problem,) = _problems(_one(command="c", timeout="soon"))
    assert problem.startswith("servers.x.timeout: ")


def test_wrong_type_for_args():
    assert _problems(_one(command="c", args="--flag")) == ["servers.x.args: Input should be a valid list"]
    assert _problems(_one(command="c", args=["ok", 1])) == ["servers.x.args.1: Input should be a valid string"]


def test_wrong_type_for_env_and_headers():
    assert _problems(_one(command="c", env=["A=1"])) == ["servers.x.env: Input should be a valid dictionary"]
    assert _problems(_one(url="http://h", headers={"A": 1})) == ["servers.x.headers.A: Input should be a valid string"]


def test_every_problem_reported_at_once():
    data = {
        "sevrers": {},
        "servers": {
            "a": {"comand": "x"},
            "b": {"command": "c", "url": "http://h"},
            "bad name": {"command": "c"},
            "c": {"command": "c", "timeout": 0, "args": "x"},
            "d": {"command": "c", "only": ["[x"]},
            "ok": {"command": "c"},
        },
    }
    problems = _problems(data)
    assert problems[0].startswith("sevrers: unknown key (expected one of: servers, mcpServers")
    assert problems[1:] == [
        "servers.a.comand: unknown key",
        "servers.b: give exactly one of `command` (stdio) or `url` (HTTP)",
        "servers.bad name: bad server name 'bad name' (use letters, digits, '.', '_' or '-', "
        "starting with a letter or digit, at most 64 characters)",
        "servers.c.args: Input should be a valid list",
        "servers.c.timeout: Input should be greater than 0",
        "servers.d.only[0]: pattern '[x' has an unclosed '['",
    ]
    assert str(ConfigError(problems)) == "\n".join(problems)


def test_bad_glob_does_not_hide_other_problems_of_the_server():
    assert _problems(_one(command="c", only=["[abc"], comand="x")) == [
        "servers.x.only[0]: pattern '[abc' has an unclosed '['",
        "servers.x.comand: unknown key",
    ]


def test_bad_transport_does_not_hide_other_problems_of_the_server():
    problems = _problems(_one(url="http://h", transport="websocket", comand="x"))
    assert len(problems) == 2
    assert "servers.x.comand: unknown key" in problems


def test_bad_type_is_reported_at_type():
    (problem,) = _problems({"mcpServers": {"x": {"url": "http://h", "type": "websocket"}}})
    assert problem.startswith("mcpServers.x.type: ")


def test_server_in_both_sections():
    assert _problems({"servers": {"x": {"command": "a"}}, "mcpServers": {"x": {"command": "b"}}}) == [
        "mcpServers.x: server 'x' is also defined in servers"
    ]


def test_duplicate_effective_prefix_names_both_servers():
    (problem,) = _problems({"servers": {"a": {"command": "a"}, "b": {"command": "b", "prefix": "a"}}})
    assert problem == "servers.b.prefix: prefix 'a' is also used by server 'a'"


def test_names_that_sanitise_to_the_same_prefix_clash():
    (problem,) = _problems({"servers": {"a.b": {"command": "a"}, "a_b": {"command": "b"}}})
    assert problem == "servers.a_b.prefix: prefix 'a_b' is also used by server 'a.b'"


def test_prefix_clash_in_mcp_servers_has_the_right_place():
    (problem,) = _problems({"mcpServers": {"a.b": {"command": "a"}, "a_b": {"command": "b"}}})
    assert problem.startswith("mcpServers.a_b")


def test_empty_prefix_allowed_and_bare():
    config = parse_config({"servers": {"a": {"command": "a", "prefix": ""}, "b": {"command": "b", "prefix": ""}}})
    assert [(s.prefix, s.effective_prefix) for s in config.servers] == [("", ""), ("", "")]


def test_prefix_is_sanitised():
    (spec,) = parse_config(_one(command="c", prefix="my.p x")).servers
    assert spec.effective_prefix == "my_p_x"
    (spec,) = parse_config({"servers": {"my.server": {"command": "c"}}}).servers
    assert spec.effective_prefix == "my_server"


def test_disabled_server_does_not_claim_its_prefix():
    config = parse_config({"servers": {"a": {"command": "a"}, "b": {"command": "b", "prefix": "a", "disabled": True}}})
    assert [s.name for s in config.servers] == ["a", "b"]


def test_unknown_top_level_key_without_settings_keys():
    assert _problems({"port": 8080}) == ["port: unknown key (expected one of: servers, mcpServers)"]


def test_settings_keys_accepted_at_top_level():
    data = {
        "host": "0.0.0.0",
        "port": 9000,
        "allowed_hosts": ["gw"],
        "log_level": "debug",
        "servers": {"x": {"command": "c"}},
    }
    config = parse_config(data, FILE_KEYS)
    assert config.settings == {"host": "0.0.0.0", "port": 9000, "allowed_hosts": ["gw"], "log_level": "debug"}
    assert [s.name for s in config.servers] == ["x"]


def test_config_key_is_not_a_file_setting():
    (problem,) = _problems({"config": "other.yaml"}, FILE_KEYS)
    assert problem.startswith("config: unknown key")


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("servers:\n  x: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: not valid YAML")
    assert str(path) in str(info.value)


def test_invalid_json_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"mcpServers": {"x": }')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: not valid JSON")


def test_missing_file_names_the_file(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems[0].startswith(f"{path}: cannot read the config file")


def test_load_config_passes_settings_keys(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("port: 9001\nservers: {}\n")
    assert load_config(path, FILE_KEYS).settings == {"port": 9001}
    with pytest.raises(ConfigError):
        load_config(path)


# --- glob_problem ----------------------------------------------------------------------


@pytest.mark.parametrize("glob", ["search_*", "get_?ime", "[ab]*", "[!ab]*", "[]]x", "exact_name", "*"])
def test_good_globs(glob):
    assert glob_problem(glob) is None


@pytest.mark.parametrize(
    ("glob", "why"),
    [
        ("[abc", "pattern '[abc' has an unclosed '['"),
        ("a[", "pattern 'a[' has an unclosed '['"),
        ("", "empty pattern"),
        ("x]", "pattern 'x]' has a ']' without '['"),
        ("a b", "pattern 'a b' contains whitespace or control characters"),
        (None, "expected a tool name or glob (a string), got NoneType"),
    ],
)
def test_bad_globs(glob, why):
    assert glob_problem(glob) == why


# --- interpolation ------------------------------------------------------------------------


def test_interpolate_plain_variable():
    assert interpolate("Bearer ${TOKEN}", {"TOKEN": "abc"}) == "Bearer abc"


def test_interpolate_several_and_untouched_text():
    env = {"A": "1", "B": "2"}
    assert interpolate("${A}-${B}-$A-${A", env) == "1-2-$A-${A"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [({}, "http://localhost:8000"), ({"HOST": ""}, "http://localhost:8000"), ({"HOST": "h"}, "http://h:8000")],
)
def test_interpolate_default_when_unset_or_empty(environ, expected):
    assert interpolate("http://${HOST:-localhost}:8000", environ) == expected


def test_interpolate_empty_default():
    assert interpolate("[${X:-}]", {}) == "[]"


def test_interpolate_set_but_empty_without_default_is_empty():
    assert interpolate("[${X}]", {"X": ""}) == "[]"


def test_interpolate_missing_raises_naming_the_variable():
    with pytest.raises(MissingVariable) as info:
        interpolate("${SET} ${UNSET}", {"SET": "v"})
    assert info.value.name == "UNSET"
    assert str(info.value) == "environment variable UNSET is not set"


def test_interpolate_does_not_expand_values_again():
    assert interpolate("${A}", {"A": "${B}", "B": "no"}) == "${B}"


def _spec(**options) -> ServerSpec:
    (spec,) = parse_config(_one(**options)).servers
    return spec


def test_resolve_fills_url_headers_env_and_args():
    spec = _spec(
        command="run",
        args=["--token", "${TOKEN}", "--region=${REGION:-eu}"],
        env={"HOME_DIR": "${HOME_DIR}", "LEVEL": "${LEVEL:-info}"},
        cwd="${NOT_FILLED}",
    )
    env = {"TOKEN": "t0k", "HOME_DIR": "/home/u"}
    resolved = resolve(spec, env)
    assert resolved.command == "run"
    assert resolved.args == ["--token", "t0k", "--region=eu"]
    assert resolved.env == {"HOME_DIR": "/home/u", "LEVEL": "info"}
    assert resolved.cwd == "${NOT_FILLED}"
    assert resolved.url is None
    assert spec.args == ["--token", "${TOKEN}", "--region=${REGION:-eu}"], "the spec is left as written"

    http = _spec(url="https://${HOST}/mcp", headers={"Authorization": "Bearer ${TOKEN}"})
    resolved = resolve(http, {"HOST": "api.example.com", "TOKEN": "t0k"})
    assert resolved.url == "https://api.example.com/mcp"
    assert resolved.headers == {"Authorization": "Bearer t0k"}
    assert resolved.command is None


def test_resolve_missing_names_the_place_and_never_a_value():
    spec = _spec(url="https://h/mcp", headers={"Authorization": "Bearer ${X}", "X-Other": "${SECRET}"})
    with pytest.raises(ConfigError) as info:
        resolve(spec, {"SECRET": "s3cr3t-value"})
    assert info.value.problems == ["headers.Authorization: environment variable X is not set"]
    assert "s3cr3t-value" not in str(info.value)


def test_resolve_missing_in_same_string_as_a_set_secret():
    spec = _spec(url="https://h/mcp", headers={"Authorization": "${USER_SECRET}:${PASS}"})
    with pytest.raises(ConfigError) as info:
        resolve(spec, {"USER_SECRET": "hunter2"})
    assert info.value.problems == ["headers.Authorization: environment variable PASS is not set"]
    assert "hunter2" not in str(info.value)


def test_missing_variables_lists_each_place():
    spec = _spec(
        command="run",
        args=["ok", "${A1}"],
        env={"E": "${E1}", "F": "${F1:-fine}"},
        headers={"H": "${H1}"},
    )
    assert missing_variables(spec, {}) == [
        "args[1]: environment variable A1 is not set",
        "env.E: environment variable E1 is not set",
        "headers.H: environment variable H1 is not set",
    ]
    url = _spec(url="${BASE}/mcp")
    assert missing_variables(url, {}) == ["url: environment variable BASE is not set"]
    assert missing_variables(url, {"BASE": "http://h"}) == []


def test_missing_variables_empty_when_all_set():
    spec = _spec(command="run", args=["${A}"])
    assert missing_variables(spec, {"A": ""}) == []
    assert resolve(spec, {"A": ""}).args == [""]
