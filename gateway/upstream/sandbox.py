"""Sandboxed stdio servers: each runs under bubblewrap (`bwrap`) and sees only what its policy grants.

A sandboxed server gets its own mount, PID, IPC, UTS, user and (with `network: none`) network namespaces, no
capabilities, and a filesystem built from nothing:

- the system read-only: `/usr`, the `/bin`, `/sbin` and `/lib*` links or directories, and from `/etc` only the
  entries in `ETC` (loader, certificates, name service, time zone: no shadow, no ssh, no private keys);
- its own program read-only: the installation the command lives in (a venv, a Python or Node prefix, the
  outermost `node_modules`), found through symlinks, a script's `#!` interpreter and a venv's base Python;
  with `scripts` (not for servers clients hand over), the same for each program its arguments name by an
  absolute path, the package of each script they name (`node .../dist/index.js`, `python server.py`), and each
  other file they name (`--tools-file /srv/tools.json`);
- the launcher's package cache read-only (npm's for `npx`/`npm`, uv's for `uv`/`uvx`);
- its `cwd` and `read` paths read-only, its `write` paths read-write;
- a private `/proc`, a minimal `/dev`, an empty `/tmp` and an empty HOME (`/home/sandbox`), both in memory.

Limits are rlimits set inside the sandbox by `prlimit` (util-linux): `memory` is RLIMIT_DATA (writable memory, so
the address space V8 and Go reserve is not counted), `cpu_time` RLIMIT_CPU (SIGXCPU, then SIGKILL a second later),
`processes` RLIMIT_NPROC (counted per sandbox, since each has its own user namespace), `file_size` RLIMIT_FSIZE.
Root is exempt from RLIMIT_NPROC: a gateway running as root bounds processes with a pids cgroup of its own when it
may create one, and says so when it cannot. A server killed by a limit is logged and counted
(`manifold_sandbox_limit_hits_total`); it then restarts with backoff as any server that died.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from itertools import count
from pathlib import Path

import anyio

from gateway.config.servers import SandboxSpec, ServerSpec
from gateway.observe.logs import get_logger

log = get_logger("sandbox")

HOME = "/home/sandbox"
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "debian_version",
    "gai.conf",
    "gitconfig",
    "group",
    "host.conf",
    "hostname",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "pki/ca-trust",
    "pki/tls/certs",
    "protocols",
    "python3",
    "resolv.conf",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
)
SCRIPT_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts")
NPM = frozenset({"npx", "npm", "npx-cli.js", "npm-cli.js"})
UV = frozenset({"uv", "uvx"})
Limit = str  # "cpu_time", "file_size", "processes"
LIMIT_SIGNALS = {signal.SIGXCPU: "cpu_time", signal.SIGXFSZ: "file_size"}

_default = SandboxSpec()
_works: set[str] = set()  # bwrap binaries that passed the probe
_groups = count(1)
_swept: set[Path] = set()  # cgroup directories cleared of groups left by gateways that are gone


class SandboxUnavailable(RuntimeError):
    """A server asks for a sandbox that cannot be made here; it does not start (never unsandboxed)."""


def use_default(policy: SandboxSpec) -> None:
    """Set the process-wide policy of stdio servers that do not give their own (the `sandbox` setting)."""
    global _default
    _default = policy


def policy_of(spec: ServerSpec) -> SandboxSpec | None:
    """The policy `spec` runs under, or None when it runs unsandboxed (an HTTP server, or `sandbox: off`)."""
    if spec.kind != "stdio":
        return None
    policy = _default if spec.sandbox is None else spec.sandbox.over(_default)
    return policy if policy.enabled else None


async def sandbox_for(spec: ServerSpec, on_limit: Callable[[str, Limit], None] | None = None) -> Sandbox | None:
    """The sandbox `spec`'s process starts in, None when it runs unsandboxed. Raises `SandboxUnavailable`."""
    policy = policy_of(spec)
    if policy is None:
        return None
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"sandbox: {MISSING}")
    if bwrap not in _works:
        if (why := await anyio.to_thread.run_sync(probe, bwrap)) is not None:
            raise SandboxUnavailable(f"sandbox: {why}")
        _works.add(bwrap)
    return Sandbox(spec.name, policy, bwrap, on_limit)


MISSING = (
    "bubblewrap is not installed (no `bwrap` on PATH): install it (Debian: apt-get install bubblewrap), "
    "or set `sandbox: off` on servers that may run unsandboxed"
)


def problem() -> str | None:
    """Why no sandbox can be made here (bubblewrap missing, namespaces refused), or None when one can."""
    bwrap = shutil.which("bwrap")
    return MISSING if bwrap is None else probe(bwrap)


def probe(bwrap: str) -> str | None:
    """Start `true` in an empty sandbox with every namespace; why that failed, or None."""
    argv = [bwrap, *_namespaces("none"), *_system(), "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=15, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap ({bwrap}) did not run: {e}"
    if done.returncode == 0:
        return None
    said = done.stderr.decode(errors="replace").strip().splitlines()
    return (
        f"bubblewrap cannot create its namespaces here ({said[-1] if said else f'exit {done.returncode}'}); "
        "unprivileged user namespaces must be allowed (in a container: see the README's Sandbox section)"
    )


def _namespaces(network: str) -> list[str]:
    # --as-pid-1: bwrap reaps the namespace's init itself (with an init of its own, bwrap exits on the command's
    # exit before reaping that init, whose zombie then keeps the process group alive until PID 1 reaps it).
    args = ["--unshare-all", "--unshare-user", "--die-with-parent", "--as-pid-1"]
    if network == "all":
        args.append("--share-net")
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL"]
    return args


def _system() -> list[str]:
    """`/usr` and the top-level links into it (or directories, on a system without merged /usr), read-only."""
    args: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for entry in ETC:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    return [*args, "--proc", "/proc", "--dev", "/dev"]


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _hops(path: str) -> Iterator[str]:
    """`path`, then each symlink it leads through, ending with its real path."""
    seen = 0
    while os.path.islink(path) and seen < 40:
        yield path
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        seen += 1
    yield path
    real = os.path.realpath(path)
    if real != path:
        yield real


def _installation(prefix: str) -> bool:
    """Whether `prefix` is a venv, or a Python or Node installation (its `bin` holds the program)."""
    p = Path(prefix)
    return (
        (p / "pyvenv.cfg").is_file()
        or (p / "bin" / "node").exists()
        or any((p / "lib").glob("python3*"))
        or (p / "lib" / "node_modules").is_dir()
    )


def _package_of(path: str) -> str:
    """What to make visible for a program file: the outermost `node_modules` it is in, the installation whose
    `bin` it is in, else the file alone."""
    parts = Path(path).parts
    if "node_modules" in parts:
        return str(Path(*parts[: parts.index("node_modules") + 1]))
    directory = os.path.dirname(path)
    if os.path.basename(directory) == "bin" and _installation(os.path.dirname(directory)):
        return os.path.dirname(directory)
    return path


def _interpreter(path: str, search: str | None) -> str | None:
    """The program a `#!` script runs under (through `/usr/bin/env NAME`), if `path` is one."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return shutil.which(names[0], path=search) if names else None
    return words[0]


def program_paths(program: str, search: str | None) -> list[str]:
    """The paths (outside the system) a program needs to run: see `_package_of`, for it, its interpreters and a
    venv's base Python."""
    found: list[str] = []
    seen: set[str] = set()
    todo = [program]
    while todo:
        for hop in _hops(todo.pop()):
            if hop in seen:
                continue
            seen.add(hop)
            if not _under(hop, SYSTEM):
                found.append(_package_of(hop))
            if (interpreter := _interpreter(hop, search)) is not None:
                todo.append(interpreter)
            base = _venv_base(os.path.dirname(os.path.dirname(hop)))
            if base is not None:
                todo.append(base)
    return list(dict.fromkeys(found))


def _venv_base(prefix: str) -> str | None:
    """A venv's base interpreter (`home` in its pyvenv.cfg)."""
    try:
        text = Path(prefix, "pyvenv.cfg").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            for name in ("python3", "python"):
                if os.path.exists(candidate := os.path.join(value.strip(), name)):
                    return candidate
    return None


def script_paths(args: list[str], cwd: str | None, home: str | None, search: str | None) -> list[str]:
    """What the files named in `args` (or in a word of one, as in `sh -c "exec /x/python s.py"`, or after the `=`
    of `--option=/path`) need: a program's what `program_paths` finds; a script's package, that is the outermost
    `node_modules` it is in, a JavaScript file's nearest directory with a package.json, a Python file's directory
    (never the HOME or / itself); any other file, itself. A directory is never granted this way."""
    found = []
    pieces = (piece for arg in args for piece in arg.split())
    for word in (part for piece in pieces for part in dict.fromkeys((piece, piece.partition("=")[2])) if part):
        path = os.path.normpath(os.path.join(cwd or os.getcwd(), word))
        if not os.path.isfile(path):
            continue
        if not word.endswith(SCRIPT_SUFFIXES):
            executable = os.path.isabs(word) and os.access(path, os.X_OK)
            found += program_paths(path, search) if executable else [path]
            continue
        package = _package_of(path)
        if package == path and not path.endswith(".py"):
            package = next(
                (str(d) for d in Path(path).parents if (d / "package.json").is_file()), os.path.dirname(path)
            )
        elif package == path:
            package = os.path.dirname(path)
        found.append(path if package in ("/", home) else package)
    return found


def cache_paths(program: str, environ: Mapping[str, str], home: str | None) -> dict[str, str]:
    """The launcher's package cache (read-only), as the variables that point it there."""
    names = {os.path.basename(hop) for hop in _hops(program)}
    caches: dict[str, str] = {}
    if names & NPM:
        caches["npm_config_cache"] = environ.get("npm_config_cache") or os.path.join(home or "/", ".npm")
    if names & UV:
        cache = environ.get("XDG_CACHE_HOME") or os.path.join(home or "/", ".cache")
        data = environ.get("XDG_DATA_HOME") or os.path.join(home or "/", ".local", "share")
        caches["UV_CACHE_DIR"] = environ.get("UV_CACHE_DIR") or os.path.join(cache, "uv")
        caches["UV_PYTHON_INSTALL_DIR"] = os.path.join(data, "uv", "python")
        caches["UV_TOOL_DIR"] = os.path.join(data, "uv", "tools")
    return {k: v for k, v in caches.items() if os.path.isdir(v)}


def _grants(binds: list[tuple[str, bool]]) -> list[str]:
    """Bind options, parents before children; a path given twice is writable if either says so, and a path
    inside another of the same kind is left out."""
    writable: dict[str, bool] = {}
    for path, write in binds:
        path = os.path.normpath(path)
        writable[path] = writable.get(path, False) or write
    args: list[str] = []
    kept: list[tuple[str, bool]] = []
    for path in sorted(writable, key=lambda p: (p.count("/"), p)):
        write = writable[path]
        inner = [w for parent, w in kept if path.startswith(parent + "/")]
        if inner and inner[-1] == write:
            continue
        kept.append((path, write))
        args += ["--bind" if write else "--ro-bind", path, path]
    return args


def limit_args(policy: SandboxSpec) -> list[str]:
    """`prlimit` options for the policy's limits (and no core dumps)."""
    args = ["--core=0"]
    if policy.memory is not None:
        args.append(f"--data={int(policy.memory)}")
    if policy.cpu_time is not None:
        seconds = math.ceil(policy.cpu_time)
        args.append(f"--cpu={seconds}:{seconds + 1}")
    if policy.processes is not None:
        args.append(f"--nproc={policy.processes}")
    if policy.file_size is not None:
        args.append(f"--fsize={int(policy.file_size)}")
    return args


def pids_cgroup() -> Path | None:
    """The pids-controller directory of this process's cgroup, if this process may create groups in it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            base = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                if "pids" not in (base / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        else:
            continue
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            return base
    return None


def _sweep(base: Path) -> None:
    """Remove the empty cgroups left by gateways that are gone (killed before they could remove their own)."""
    for group in base.glob("manifold-*-*"):
        owner = group.name.split("-")[1]
        if not owner.isdigit() or int(owner) == os.getpid():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            with suppress(OSError):
                group.rmdir()  # refused while a process is still in it
        except PermissionError:
            continue


class Sandbox:
    """One server's sandbox: wraps its command in bwrap, and reads its exit for a limit it hit."""

    def __init__(
        self, server: str, policy: SandboxSpec, bwrap: str, on_limit: Callable[[str, Limit], None] | None = None
    ) -> None:
        self.server = server
        self.policy = policy
        self.bwrap = bwrap
        self.on_limit = on_limit
        self.cgroup: Path | None = None

    def wrap(
        self, argv: list[str], environment: Mapping[str, str], cwd: str | None, given: Mapping[str, str]
    ) -> tuple[list[str], dict[str, str], str | None]:
        """The command line, environment and working directory that run `argv` in the sandbox. `given` is the
        environment the config gave (its HOME, if any, is kept). Raises `SandboxUnavailable`, and
        `FileNotFoundError` for a command that does not exist."""
        policy = self.policy
        program = os.path.join(cwd or os.getcwd(), argv[0])
        if not os.path.isfile(program):
            raise FileNotFoundError(2, "command not found", program)
        home = os.environ.get("HOME")
        search = environment.get("PATH")
        env = dict(environment)
        binds: list[tuple[str, bool]] = [(p, False) for p in program_paths(program, search)]
        if policy.scripts:
            for script in script_paths(argv[1:], cwd, home, search):
                binds += [(script, False)]
        for variable, cache in cache_paths(program, environment, home).items():
            binds.append((cache, False))
            env.setdefault(variable, cache)
        for path in policy.read:
            binds.append((self._existing(path, "read"), False))
        for path in policy.write:
            binds.append((self._existing(path, "write", create=True), True))
        if cwd is not None:
            binds.append((os.path.abspath(cwd), False))
        if "HOME" not in given:
            env["HOME"] = HOME
        env.pop("TMPDIR", None)
        size = [] if policy.memory is None else ["--size", str(int(policy.memory))]
        args = [self.bwrap, *_namespaces(policy.network), *_system()]
        args += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", HOME]
        args += _grants([(p, w) for p, w in binds if not _under(os.path.normpath(p), SYSTEM)])
        args += ["--chdir", os.path.abspath(cwd) if cwd is not None else HOME]
        prlimit = shutil.which("prlimit", path="/usr/bin:/bin")
        shell = shutil.which("sh", path="/usr/bin:/bin")
        if prlimit is None or shell is None:
            raise SandboxUnavailable("sandbox: `prlimit` (util-linux) or `sh` is missing, so no limits can be set")
        # The init is a shell that runs the command as its child, not in its place: the kernel spares an init the
        # signals it has no handler for (SIGXCPU, SIGTERM), and the shell exits with the command's status.
        args += ["--", shell, "-c", '"$@"; exit', "sh", prlimit, *limit_args(policy), "--", *argv]
        return self._in_cgroup(args), env, None

    def _existing(self, path: str, kind: str, *, create: bool = False) -> str:
        """`path` with `~` expanded (the gateway's HOME); a missing `write` directory is made (mode 0700)."""
        path = os.path.expanduser(path)
        if create and not os.path.exists(path):
            try:
                os.makedirs(path, mode=0o700)
            except OSError as e:
                raise SandboxUnavailable(f"sandbox.{kind}: cannot make {path}: {e.strerror}") from None
        if not os.path.exists(path):
            raise SandboxUnavailable(f"sandbox.{kind}: {path} does not exist")
        return path

    def _in_cgroup(self, argv: list[str]) -> list[str]:
        """As root (exempt from RLIMIT_NPROC), `argv` run in a pids cgroup of its own, when one can be made."""
        if os.geteuid() != 0 or self.policy.processes is None:
            return argv
        base = pids_cgroup()
        if base is None:
            log.warning(
                "sandbox: the processes limit is not enforced: the gateway runs as root (exempt from RLIMIT_NPROC) "
                "and may not create a pids cgroup",
                server=self.server,
            )
            return argv
        if base not in _swept:
            _swept.add(base)
            _sweep(base)
        group = base / f"manifold-{os.getpid()}-{next(_groups)}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(self.policy.processes))
        except OSError as e:
            log.warning(
                "sandbox: no pids cgroup; the processes limit is not enforced", server=self.server, error=str(e)
            )
            return argv
        self.cgroup = group
        return ["/bin/sh", "-c", 'echo $$ >"$0/cgroup.procs" && exec "$@"', str(group), *argv]

    async def exited(self, code: int | None) -> None:
        """Log and count a limit the server hit (from its exit status and its cgroup), and remove its cgroup."""
        hits: list[Limit] = []
        for sig, limit in LIMIT_SIGNALS.items():
            if code in (128 + sig, -sig):
                hits.append(limit)
        if self.cgroup is not None:
            try:
                events = (self.cgroup / "pids.events").read_text().split()
                if events[:1] == ["max"] and int(events[1]) > 0:
                    hits.append("processes")
            except (OSError, IndexError, ValueError):
                pass
            for _ in range(40):
                try:
                    self.cgroup.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    await anyio.sleep(0.05)
            self.cgroup = None
        for limit in hits:
            log.warning("sandbox limit hit", server=self.server, limit=limit, code=code)
            if self.on_limit is not None:
                self.on_limit(self.server, limit)


def check(specs: list[ServerSpec]) -> tuple[list[str], list[str]]:
    """What `manifold check` says of the stdio servers' sandboxes: warnings (a server that runs unsandboxed) and
    errors (sandboxed servers that cannot start, for bubblewrap is missing or refused)."""
    stdio = [s for s in specs if s.kind == "stdio" and not s.disabled]
    warnings = [
        f"server {s.name!r} runs unsandboxed (sandbox: off): it can read and write whatever the gateway can, and "
        "reach any network"
        for s in stdio
        if policy_of(s) is None
    ]
    sandboxed = [s.name for s in stdio if policy_of(s) is not None]
    errors = []
    if sandboxed and (why := problem()) is not None:
        errors.append(f"servers {', '.join(sandboxed)} are sandboxed, but {why}")
    return warnings, errors
