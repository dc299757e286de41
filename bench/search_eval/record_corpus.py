"""Record the tool listings of the compatibility corpus into corpus_catalog.json (run once, by hand).

The corpus (`tests/corpus/catalog.py`: real servers from npm and PyPI, installed by `make corpus`) is started
as its test starts it, all behind one gateway, and the tools are read through the gateway with the SDK's client
(`python -m bench.search_eval.record_corpus`). Each server's entry keeps the package, its version and its tools
as the server lists them (original name, title, description, inputSchema, annotations); a server that does not
come up is named in `missing`. The independent query set (`independent.json`) is labelled against this file.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

from bench.search_eval.record import KEEP
from tests.corpus.catalog import SERVERS
from tests.integration.conftest import REDIS, RedisServer, run_gateway
from tests.integration.test_corpus import (
    STARTUP,
    listings,
    owner,
    prepare,
    server_entry,
    settle,
    start_http,
    stop_http,
    wait_listening,
)

HERE = Path(__file__).resolve().parent
OUT = HERE / "corpus_catalog.json"


def record(work: Path) -> dict[str, Any]:
    prepare(work)
    redis = RedisServer(work) if REDIS is not None else None
    if redis is not None:
        redis.start()
    redis_url = f"redis://127.0.0.1:{redis.port}" if redis is not None else ""
    running = {s.name: s for s in SERVERS if "redis" not in s.needs or redis is not None}
    http = [start_http(s, work, redis_url) for s in running.values() if s.transport != "stdio"]
    try:
        wait_listening(http, 60)
        by_name = {h.server.name: h for h in http}
        config = {"servers": {name: server_entry(s, work, redis_url, by_name.get(name)) for name, s in running.items()}}
        with run_gateway(work, config) as gateway:
            settle(gateway, set(running), STARTUP + 30, work / "readyz.json")
            listed = anyio.run(listings, gateway.url, "2025-11-25")["tools"]
    finally:
        stop_http(http)
        if redis is not None:
            redis.stop()
    tools: dict[str, list[dict[str, Any]]] = {}
    for tool in listed:
        server = owner(tool)
        if server is None:
            continue
        original = (tool.get("_meta") or {}).get("manifold/tool") or tool["name"].split("__", 1)[1]
        kept = {k: tool[k] for k in KEEP if k in tool}
        kept["name"] = original
        tools.setdefault(server, []).append(kept)
    servers = [
        {"name": s.name, "package": s.package, "registry": s.registry, "version": s.version, "tools": tools[s.name]}
        for s in SERVERS
        if s.name in tools
    ]
    return {
        "about": "Tool listings of the compatibility corpus (tests/corpus), read through the gateway by "
        "bench/search_eval/record_corpus.py; not edited by hand.",
        "missing": sorted(s.name for s in SERVERS if s.name not in tools),
        "servers": servers,
    }


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="corpus-listing-") as tmp:
        catalog = record(Path(tmp))
    OUT.write_text(json.dumps(catalog, indent=1, ensure_ascii=False) + "\n")
    tools = sum(len(s["tools"]) for s in catalog["servers"])
    print(f"wrote {OUT}: {len(catalog['servers'])} servers, {tools} tools; missing: {catalog['missing']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
