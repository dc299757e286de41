"""The TypeScript SDK v2 client (`@modelcontextprotocol/client`, MCP 2026-07-28) against the gateway.

`everything_client_2026.mjs` connects pinned to 2026-07-28 and walks server-everything's surface through
the gateway: prompts, resources, templates, a completion, a plain tool call, and the server's 2025-era
requests of the user (sampling, elicitation), which the gateway holds and turns into `input_required`
rounds that the v2 client answers through its handlers (and, once more, in manual mode, so each round and
its `_meta` can be checked). One gateway per upstream transport (stdio, streamable HTTP) serves the module;
the client runs once per gateway and each test checks one part of its summary.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.fixtures.servers import run_everything_http
from tests.integration.conftest import THIRDPARTY, Gateway, run_gateway

NODE = shutil.which("node")
EVERYTHING = THIRDPARTY / "server-everything" / "dist" / "index.js"
DOCS = EVERYTHING.parent / "docs"
V2_CLIENT = THIRDPARTY / "client" / "package.json"
TS_CLIENT = Path(__file__).with_name("everything_client_2026.mjs")
MODERN = "2026-07-28"

TOKEN = "ts2026-full-token-0123456789abcdef"
ENV = {"T_TS2026_TOKEN": TOKEN}
TIMEOUT = 10  # the server's call timeout in the gateway: bounds how long a held call waits for its answers

PROMPTS = {"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"}
TEMPLATES = {"demo://resource/dynamic/text/{resourceId}", "demo://resource/dynamic/blob/{resourceId}"}
DOC = "demo://resource/static/document/"
LABELS = {"manifold/server": "everything", "manifold/trust": "outside"}

if NODE is None or not EVERYTHING.exists() or not V2_CLIENT.exists():  # pragma: no cover - npm deps missing
    pytest.skip("node, server-everything or @modelcontextprotocol/client is not installed", allow_module_level=True)


def docs() -> dict[str, str]:
    """The static resources server-everything offers: one per file of its docs directory, by URI."""
    return {f"{DOC}{p.name}": p.read_text(encoding="utf-8") for p in sorted(DOCS.iterdir()) if p.is_file()}


def assert_labelled(meta: dict[str, Any] | None) -> None:
    """A result the gateway passed on at 2026-07-28: its server, its trust, and Manifold's identity."""
    assert meta is not None
    assert meta["manifold/server"] == "everything"
    assert meta["manifold/trust"] == "outside"
    assert meta["io.modelcontextprotocol/serverInfo"]["name"] == "manifold"


# --- the upstream, the gateways, the client run -----------------------------------------------------------------


@pytest.fixture(scope="module")
def everything_http() -> Iterator[str]:
    """server-everything over streamable HTTP, for the module."""
    assert NODE is not None
    with run_everything_http(NODE, EVERYTHING) as url:
        yield url


@dataclass
class Run:
    """One run of the v2 client against a gateway: its summary line, and the gateway it talked to."""

    transport: str
    gateway: Gateway
    summary: dict[str, Any]


@pytest.fixture(scope="module", params=["stdio", "http"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """A gateway with server-everything behind it over `param`, and the v2 client's summary of it."""
    assert NODE is not None
    transport: str = request.param
    where: dict[str, Any] = (
        {"url": request.getfixturevalue("everything_http")}
        if transport == "http"
        else {"command": NODE, "args": [str(EVERYTHING), "stdio"]}
    )
    config = {
        "auth": {"tokens": [{"name": "full", "token": "${T_TS2026_TOKEN}"}]},
        "servers": {"everything": {**where, "timeout": TIMEOUT, "required": True}},
    }
    with run_gateway(tmp_path_factory.mktemp(f"ts2026-{transport}"), config, env=ENV) as gw:
        deadline = time.monotonic() + 20
        while httpx2.get(f"{gw.base}/readyz", timeout=5).status_code != 200:  # the server is up: its offer is in
            assert time.monotonic() < deadline, f"server-everything never came up:\n{gw.log()}"
            time.sleep(0.1)
        done = subprocess.run(
            [NODE, str(TS_CLIENT), gw.url],
            env={**os.environ, "MANIFOLD_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{done.stderr}\n--- gateway log ---\n{gw.log()}"
        yield Run(transport, gw, json.loads(done.stdout.strip().splitlines()[-1]))


# --- the tests --------------------------------------------------------------------------------------------------


def test_the_client_speaks_2026_to_manifold(run: Run) -> None:
    s = run.summary
    assert s["era"] == "modern"
    assert s["protocolVersion"] == MODERN
    assert s["server"]["name"] == "manifold"
    assert MODERN in s["discoverVersions"]


def test_listings_carry_the_servers_prompts_resources_and_templates(run: Run) -> None:
    s = run.summary
    assert sorted(s["prompts"]) == sorted(f"everything__{p}" for p in PROMPTS)
    assert s["resources"] == list(docs())
    assert sorted(s["templates"]) == sorted(TEMPLATES)


def test_prompts(run: Run) -> None:
    simple, args = run.summary["simplePrompt"], run.summary["argsPrompt"]
    assert simple["messages"] == [
        {"role": "user", "content": {"type": "text", "text": "This is a simple prompt without arguments."}}
    ]
    assert args["messages"] == [
        {"role": "user", "content": {"type": "text", "text": "What's weather in Nantes, Loire?"}}
    ]
    assert_labelled(simple["meta"])
    assert_labelled(args["meta"])


def test_a_static_resource_is_the_servers_file(run: Run) -> None:
    read = run.summary["staticRead"]
    uri = f"{DOC}features.md"
    assert read["contents"] == [{"uri": uri, "mimeType": "text/markdown", "text": docs()[uri]}]
    assert_labelled(read["meta"])


def test_a_templated_resource(run: Run) -> None:
    read = run.summary["templateRead"]
    [content] = read["contents"]
    assert content["uri"] == "demo://resource/dynamic/text/1"
    assert content["mimeType"] == "text/plain"
    assert re.fullmatch(r"Resource 1: This is a plaintext resource created at .+", content["text"]), content
    assert_labelled(read["meta"])


def test_a_prompt_argument_completes(run: Run) -> None:
    completion = run.summary["completion"]
    assert "Engineering" in completion["completion"]["values"]
    assert completion["completion"]["values"] == ["Engineering"]  # the only department starting with "Eng"
    assert_labelled(completion["meta"])


def test_echo(run: Run) -> None:
    echo = run.summary["echo"]
    assert echo["isError"] is False
    assert echo["text"] == "Echo: hello from v2"
    assert_labelled(echo["meta"])


def sampled(result: dict[str, Any]) -> Any:
    """The sampling result trigger-sampling-request reports (it echoes the client's answer as JSON)."""
    prefix = "LLM sampling result: \n"
    assert result["isError"] is False, result["text"]
    assert result["text"].startswith(prefix), result["text"]
    return json.loads(result["text"][len(prefix) :])


def elicited(result: dict[str, Any]) -> Any:
    """The elicitation result trigger-elicitation-request reports (the client's answer, raw, as JSON)."""
    assert result["isError"] is False, result["text"]
    _, found, raw = result["text"].partition("\nRaw result: ")
    assert found, result["text"]
    return json.loads(raw)


@pytest.mark.parametrize("via", ["handler", "manual"])
def test_sampling_is_answered_by_the_2026_client(run: Run, via: str) -> None:
    """The held call's sampling request reaches the client (through its handler, or its manual round), and the
    client's answer reaches the server and the tool result."""
    s = run.summary
    prompt = "ping from ts2026" if via == "handler" else "manual ping from ts2026"
    question = f"Resource trigger-sampling-request context: {prompt}"
    [asked] = [a for a in s["asked"]["sampling"] if a["via"] == via]
    assert asked["question"] == question
    assert asked["systemPrompt"] == "You are a helpful test server."
    assert asked["maxTokens"] == 20
    result = s["sampling"] if via == "handler" else s["manualSampling"]["result"]
    assert sampled(result) == {
        "model": f"ts2026-model-{via}",
        "stopReason": "endTurn",
        "role": "assistant",
        "content": {"type": "text", "text": f"ts2026 {via} answer to: {question}"},
    }
    assert_labelled(result["meta"])


@pytest.mark.parametrize("via", ["handler", "manual"])
def test_elicitation_is_answered_by_the_2026_client(run: Run, via: str) -> None:
    s = run.summary
    [asked] = [a for a in s["asked"]["elicitation"] if a["via"] == via]
    assert asked["message"] == "Please provide inputs for the following fields:"
    assert asked["required"] == ["name"]
    result = s["elicitation"] if via == "handler" else s["manualElicitation"]["result"]
    answer = {"name": f"Grace Hopper ({via})", "check": True, "integer": 7}
    assert elicited(result) == {"action": "accept", "content": answer}
    assert f"- Name: Grace Hopper ({via})\n- Agreed to terms: true\n- Favorite Integer: 7" in result["text"]
    assert_labelled(result["meta"])


@pytest.mark.parametrize(
    ("key", "method"), [("manualSampling", "sampling/createMessage"), ("manualElicitation", "elicitation/create")]
)
def test_each_input_required_round_names_the_server_that_asks(run: Run, key: str, method: str) -> None:
    """Seen in manual mode: one `input_required` round per call, asking exactly the server's request, with a
    `requestState` to come back with, and labelled with the server that asks and its trust."""
    [round_] = run.summary[key]["rounds"]
    assert round_["methods"] == [method]
    assert round_["requestState"] is True
    assert_labelled(round_["meta"])


def test_the_gateway_relayed_each_request_once(run: Run) -> None:
    relayed = [e for e in run.gateway.log_events() if e.get("event") == "server request relayed"]
    assert [(e["server"], e["method"]) for e in relayed] == [
        ("everything", "sampling/createMessage"),
        ("everything", "elicitation/create"),
        ("everything", "sampling/createMessage"),
        ("everything", "elicitation/create"),
    ]
