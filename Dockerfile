# Manifold as a container: `docker build -t manifold .`, then
#   docker run --rm -p 127.0.0.1:8080:8080 manifold                      # the built-in config (the time server)
#   docker run --rm -p 127.0.0.1:8080:8080 \
#     -v "$PWD/my.yaml:/etc/manifold/manifold.yaml:ro" manifold           # your config
# Build with `--build-arg WITH_NODE=1` to add Node.js and npm for servers launched with npx; run those with
# `docker run --init` (compose: `init: true`) so that orphaned grandchildren (npx -> sh -> node) are reaped.
# compose.yaml next to this file is a sidecar example. The stdio servers run sandboxed (bubblewrap), which needs
# `--security-opt unmask=/proc/*` with podman (see Sandbox in the README for Docker's equivalents).

# ---- builder: a venv with the locked runtime dependencies and the package ----
FROM python:3.11-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# Dependencies first, so that a change to the code alone reuses this layer. Only the runtime ones: the
# package's `dependencies` from pyproject.toml plus mcp-server-time (the built-in config's server), each at
# the version requirements.lock pins (the lock also pins the dev tools, which the image does not need).
COPY pyproject.toml requirements.lock ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        >/tmp/runtime.txt \
    && pip install -c requirements.lock -r /tmp/runtime.txt mcp-server-time

COPY README.md ./
COPY gateway ./gateway
RUN pip install --no-deps . \
    && pip check

# ---- final image ----
FROM python:3.11-slim

ARG WITH_NODE=0
# bubblewrap, which sandboxes the stdio servers (the container needs user namespaces: see the README's Sandbox
# section); Node.js and npm from Debian, only with --build-arg WITH_NODE=1.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && if [ "$WITH_NODE" = "1" ]; then apt-get install -y --no-install-recommends nodejs npm; fi \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 manifold \
    && useradd --system --uid 10001 --gid manifold --home-dir /home/manifold --create-home \
        --shell /usr/sbin/nologin manifold

COPY --from=builder /opt/venv /opt/venv
COPY config/container.yaml /etc/manifold/manifold.yaml

# MANIFOLD_ALLOWED_HOSTS: Host headers accepted besides loopback (which is always accepted). The default
# fits a compose service named `manifold`; set your own (comma-separated, `name:*` for any port), or `*`
# behind a proxy that owns Host.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MANIFOLD_HOST=0.0.0.0 \
    MANIFOLD_PORT=8080 \
    MANIFOLD_CONFIG=/etc/manifold/manifold.yaml \
    MANIFOLD_ALLOWED_HOSTS=manifold,manifold:* \
    MANIFOLD_LOG_FORMAT=json

USER 10001:10001
WORKDIR /home/manifold
EXPOSE 8080

# python, not curl (slim has none); proxies bypassed: this is always the container's own loopback.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:%s/healthz' % os.environ.get('MANIFOLD_PORT', '8080'), timeout=2)"]

# Exec form: `manifold` is PID 1 and receives SIGTERM itself (uvicorn shuts down on it).
# `docker run IMAGE tools` or `IMAGE check` runs the other subcommands.
ENTRYPOINT ["manifold"]
CMD ["serve"]
