"""The sandbox's policy and command line: what a server is granted, how limits are set, which servers run sandboxed."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from gateway.config.servers import SandboxSpec, ServerSpec, parse_config
from gateway.core.handover import spec_of
from gateway.upstream import sandbox
from gateway.upstream.sandbox import (
    Sandbox,
    SandboxUnavailable,
    cache_paths,
    check,
    limit_args,
    policy_of,
    program_paths,
    script_paths,
    use_default,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def default_policy() -> Iterator[None]:
    use_default(SandboxSpec())
    yield
    use_default(SandboxSpec())


def stdio(name: str = "s", **options: object) -> ServerSpec:
    return ServerSpec.model_validate({"name": name, "command": "x", **options})


def test_config_servers_are_sandboxed_unless_they_say_off() -> None:
    assert policy_of(stdio()) == SandboxSpec()
    assert policy_of(stdio(sandbox=False)) is None  # YAML's `off`
    assert policy_of(stdio(sandbox="off")) is None
    assert (
        policy_of(ServerSpec.model_validate({"name": "web", "url": "http://127.0.0.1:9/mcp"})) is None
    )  # nothing to sandbox
    use_default(SandboxSpec(enabled=False, read=["/srv/shared"], memory=None))
    assert policy_of(stdio()) is None
    on = policy_of(stdio(sandbox="on"))
    assert on is not None and on.memory is None and on.read == ["/srv/shared"]


def test_a_servers_fields_replace_the_defaults_and_its_grants_add_to_them() -> None:
    use_default(SandboxSpec.model_validate({"read": ["/srv/a"], "write": ["/srv/w"], "memory": 1024, "processes": 10}))
    policy = policy_of(stdio(sandbox={"read": ["/srv/b/"], "memory": "1MiB", "network": "all"}))
    assert policy is not None
    assert policy.read == ["/srv/a", "/srv/b"] and policy.write == ["/srv/w"]
    assert (policy.memory, policy.processes, policy.network) == (1024**2, 10, "all")


def test_handed_over_servers_are_always_sandboxed_without_network_or_scripts() -> None:
    use_default(SandboxSpec(enabled=False, network="all"))
    spec = spec_of({"name": "mine", "command": "python3", "args": ["x.py"], "sandbox": "off"}, "stdio")
    policy = policy_of(spec)
    assert policy is not None and policy.network == "none" and policy.scripts is False


def test_bad_sandbox_options_are_reported_with_their_place() -> None:
    from gateway.config.servers import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_config(
            {
                "servers": {
                    "a": {"command": "x", "sandbox": {"write": ["relative"], "network": "some"}},
                    "b": {"command": "x", "sandbox": {"read": ["/"]}},
                    "c": {"url": "http://127.0.0.1:1/mcp", "sandbox": "on"},
                }
            }
        )
    text = "\n".join(e.value.problems)
    assert "servers.a.sandbox.write: 'relative' is neither an absolute path" in text
    assert "servers.a.sandbox.network" in text
    assert "servers.b.sandbox.read: granting / is no sandbox at all" in text
    assert "servers.c: `sandbox` applies to stdio servers only" in text


def test_a_venv_script_brings_its_venv_and_its_base_python(tmp_path: Path) -> None:
    base = tmp_path / "python"
    (base / "bin").mkdir(parents=True)
    (base / "lib" / "python3.11").mkdir(parents=True)
    (base / "bin" / "python3").write_text("")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\n")
    (venv / "bin" / "python").symlink_to(base / "bin" / "python3")
    script = venv / "bin" / "server"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport server\n")
    assert set(program_paths(str(script), None)) == {str(venv), str(base)}


def test_a_program_in_node_modules_brings_the_outermost_node_modules(tmp_path: Path) -> None:
    modules = tmp_path / "app" / "node_modules"
    bin_ = modules / ".bin"
    bin_.mkdir(parents=True)
    cli = modules / "pkg" / "node_modules" / "inner" / "cli.js"
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/usr/bin/env node\n")
    (bin_ / "pkg").symlink_to(cli)
    assert program_paths(str(bin_ / "pkg"), "/usr/bin:/bin") == [str(modules)]


def test_a_lone_program_is_granted_alone(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    program = tmp_path / "bin" / "server"  # a `bin` that is no installation: not its parent, the file alone
    program.write_text("\x7fELF")
    assert program_paths(str(program), None) == [str(program)]


def test_scripts_named_in_args(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text("{}")
    js = package / "dist" / "index.js"
    js.write_text("")
    py = tmp_path / "tools" / "server.py"
    py.parent.mkdir()
    py.write_text("")
    data = tmp_path / "tools.json"
    data.write_text("[]")
    args = [str(js), "--flag", "tools/server.py", f"exec {js}", "missing.py", f"--tools-file={data}", str(tmp_path)]
    named = script_paths(args, str(tmp_path), None, None)
    assert named == [str(package), str(py.parent), str(package), str(data)]  # a directory named: nothing
    home_script = tmp_path / "at_home.py"
    home_script.write_text("")
    assert script_paths([str(home_script)], None, str(tmp_path), None) == [str(home_script)]  # never the HOME


def test_npx_gets_npms_cache_read_only(tmp_path: Path) -> None:
    (tmp_path / ".npm").mkdir()
    npx = tmp_path / "npx"
    npx.write_text("")
    assert cache_paths(str(npx), {}, str(tmp_path)) == {"npm_config_cache": str(tmp_path / ".npm")}
    assert cache_paths(str(npx), {}, str(tmp_path / "elsewhere")) == {}  # no cache, nothing to grant
    assert cache_paths(sys.executable, {}, str(tmp_path)) == {}


def test_limits_become_prlimit_options() -> None:
    policy = SandboxSpec.model_validate({"memory": "1MiB", "cpu_time": 2.5, "processes": 8, "file_size": 4096})
    assert limit_args(policy) == ["--core=0", "--data=1048576", "--cpu=3:4", "--nproc=8", "--fsize=4096"]
    assert limit_args(SandboxSpec(memory=None, processes=None)) == ["--core=0"]


def test_the_command_line_grants_parents_before_children_and_nothing_twice(tmp_path: Path) -> None:
    grant = tmp_path / "data"
    (grant / "ro").mkdir(parents=True)
    policy = SandboxSpec(read=[str(grant / "ro"), str(grant)], write=[str(grant), str(tmp_path / "new")])
    box = Sandbox("s", policy, "/usr/bin/bwrap")
    argv, env, cwd = box.wrap([sys.executable, "-c", "pass"], {"PATH": "/usr/bin", "HOME": "/root"}, None, {})
    anyio.run(box.exited, 0)  # removes the pids cgroup it made (as root)
    binds = [(argv[i], argv[i + 1]) for i in range(len(argv) - 1) if argv[i] in ("--bind", "--ro-bind")]
    assert binds.index(("--bind", str(grant))) < binds.index(("--ro-bind", str(grant / "ro")))
    assert ("--ro-bind", str(grant)) not in binds  # given twice: writable wins
    assert (tmp_path / "new").is_dir()  # a missing write directory is made
    assert env["HOME"] == "/home/sandbox" and cwd is None
    assert argv[argv.index("--chdir") + 1] == "/home/sandbox"
    assert "--share-net" not in argv and "--unshare-all" in argv
    tail = argv[argv.index("--", argv.index("--chdir")) + 1 :]
    assert tail[:4] == ["/usr/bin/sh", "-c", '"$@"; exit', "sh"] and tail[4].endswith("prlimit")
    assert tail[-3:] == [sys.executable, "-c", "pass"]
    assert os.path.realpath(sys.executable).startswith((*(p for _, p in binds), "/usr"))


def test_a_missing_grant_or_command_is_a_clear_error(tmp_path: Path) -> None:
    box = Sandbox("s", SandboxSpec(read=[str(tmp_path / "absent")]), "/usr/bin/bwrap")
    with pytest.raises(SandboxUnavailable, match=r"sandbox.read: .*absent does not exist"):
        box.wrap([sys.executable], {}, None, {})
    with pytest.raises(FileNotFoundError):
        Sandbox("s", SandboxSpec(), "/usr/bin/bwrap").wrap([str(tmp_path / "nope")], {}, None, {})


def test_check_warns_of_unsandboxed_servers_and_fails_without_bubblewrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = [stdio("boxed"), stdio("open", sandbox="off"), stdio("idle", disabled=True)]
    warnings, errors = check(specs)
    assert warnings == [
        "server 'open' runs unsandboxed (sandbox: off): it can read and write whatever the gateway can, and "
        "reach any network"
    ]
    assert errors == []  # bubblewrap works here (`make system-deps` installs it)
    monkeypatch.setenv("PATH", str(tmp_path))
    _, errors = check(specs)
    assert errors == [f"servers boxed are sandboxed, but {sandbox.MISSING}"]


def test_the_probe_reports_bubblewrap_that_cannot_run(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    why = sandbox.probe(str(fake))
    assert why is not None and "No permissions to create new namespace" in why and "README" in why
    assert sandbox.probe("/usr/bin/bwrap") is None
