"""The tool-search evaluation sets of real servers' listings and labelled requests.

The project's set: catalog.json (24 servers) and queries.json, split into a tuning part and a frozen blind part.
The independent set: corpus_catalog.json (the compatibility corpus, read through the gateway) and
independent.json, requests written from tasks rather than from tool descriptions; never tuned on. A second tuning
part, tasks.json: requests over catalog.json phrased as an agent states a need mid-task, mostly without the tools'
words (written to tune the fusion with a transformer on requests like those of the independent set
without reading it).

`load()` reads both and checks every label names a tool of the catalog; `evaluate()` scores a ranking
function on the queries: recall@1, recall@5 (a query counts as found when any of its labelled tools is among
the first k) and the mean reciprocal rank of the first labelled tool. Each query of queries.json names its part:
`blind` (frozen: never tuned on, read only as totals) or `tune`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.protocol.naming import public_name

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Query:
    text: str
    expect: frozenset[str]
    held_out: bool  # in a part never tuned on (the blind part, or the independent set)
    kind: str = ""  # the independent set's kind of request: task, terse, ambiguous, cross


@dataclass(frozen=True)
class EvalSet:
    servers: list[dict[str, Any]]
    queries: list[Query]

    def tools(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(public name, server name, tool) for every tool of the catalog, in listing order."""
        for server in self.servers:
            for tool in server["tools"]:
                yield public_name(server["name"], server["name"], tool["name"]), server["name"], tool

    def make_up(self) -> dict[str, Any]:
        return {
            "servers": [
                {"name": s["name"], "package": s["package"], "version": s["version"], "tools": len(s["tools"])}
                for s in self.servers
            ],
            "tools": sum(len(s["tools"]) for s in self.servers),
            "queries": len(self.queries),
            "held_out_queries": sum(q.held_out for q in self.queries),
        }


def load(folder: Path = HERE) -> EvalSet:
    """The project's set: catalog.json and queries.json."""
    servers = json.loads((folder / "catalog.json").read_text())["servers"]
    raw = json.loads((folder / "queries.json").read_text())["queries"]
    return _checked(EvalSet(servers, [Query(q["query"], frozenset(q["expect"]), q["part"] == "blind") for q in raw]))


def load_independent(folder: Path = HERE) -> EvalSet:
    """The independent set: corpus_catalog.json (less the servers it leaves out) and independent.json."""
    raw = json.loads((folder / "independent.json").read_text())
    left_out = set(raw["left_out"])
    recorded = json.loads((folder / "corpus_catalog.json").read_text())["servers"]
    servers = [s for s in recorded if s["name"] not in left_out]
    queries = [Query(q["query"], frozenset(q["expect"]), True, q["kind"]) for q in raw["queries"]]
    return _checked(EvalSet(servers, queries))


def load_tasks(folder: Path = HERE) -> list[Query]:
    """The second tuning part: tasks.json's requests over the project's catalog (checked against it)."""
    raw = json.loads((folder / "tasks.json").read_text())["queries"]
    queries = [Query(q["query"], frozenset(q["expect"]), False, "tasks") for q in raw]
    _checked(EvalSet(load(folder).servers, queries))
    return queries


def _checked(evalset: EvalSet) -> EvalSet:
    queries = evalset.queries
    names = {name for name, _, _ in evalset.tools()}
    for q in queries:
        unknown = q.expect - names
        if unknown or not q.expect:
            raise ValueError(f"query {q.text!r} expects unknown tools {sorted(unknown)}")
    return evalset


@dataclass(frozen=True)
class Quality:
    queries: int
    recall_at_1: float
    recall_at_5: float
    mrr: float
    misses: list[tuple[str, list[str]]]  # queries with no labelled tool in the first five, and what came first

    def to_json(self) -> dict[str, Any]:
        return {
            "queries": self.queries,
            "recall_at_1": round(self.recall_at_1, 4),
            "recall_at_5": round(self.recall_at_5, 4),
            "mrr": round(self.mrr, 4),
        }


def evaluate(rank: Callable[[str], Sequence[str]], queries: Sequence[Query], depth: int = 10) -> Quality:
    """Score `rank(query) -> names best first` on `queries` (reciprocal ranks count down to `depth`)."""
    at1 = at5 = 0
    rr = 0.0
    misses: list[tuple[str, list[str]]] = []
    for q in queries:
        ranked = list(rank(q.text))[:depth]
        first = next((i for i, name in enumerate(ranked) if name in q.expect), None)
        if first is not None:
            rr += 1 / (first + 1)
            at1 += first == 0
            at5 += first < 5
        if first is None or first >= 5:
            misses.append((q.text, ranked[:5]))
    n = len(queries) or 1
    return Quality(len(queries), at1 / n, at5 / n, rr / n, misses)
