"""The `search` phase: quality of the tool search on the eval set of real servers, and its speed at 10,000 tools.

Quality: recall@1, recall@5 and MRR of gateway.catalog.search.ToolIndex on bench/search_eval, beside a plain substring
baseline (tools ranked by how many of the query's words occur in their name and description) and beside the
ranker with each of its refinements taken away, on the project's set (its tuning part, the second tuning part of
task-phrased requests, and its frozen blind part) and on the independent set, lexical alone (the default) and
fused with each embedding model (`search_model: wordllama`, `search_model: minilm`). Speed, for each: the recorded
catalog replicated under distinct server names (`github7__search_issues`) up to 10,000 tools; search latency
over the eval queries without a filter and with an `accept` that keeps one replica's tools (1 in 21), as wall
time and as the thread's own CPU time (which a busy machine does not inflate), the put and replace rates, and
the index's memory (tracemalloc, in a separate build).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bench.search_eval import EvalSet, Query, evaluate, load, load_independent, load_tasks
from gateway.catalog.search import DEFAULT_TUNING, STOP_WORDS, ToolIndex, Tuning, bundled_model, split_words

if TYPE_CHECKING:
    from bench.run import Bench
    from gateway.catalog.embedding import Embedding

TOOLS_AT_SCALE = 10_000
VIEW_COPY = 7  # the copy of the catalog a filtered search keeps
NA = "\N{EN DASH}"

# The ranker with each refinement on top of plain BM25F, one at a time, then without each one.
FLOOR = dataclasses.replace(
    DEFAULT_TUNING,
    stem=False,
    surface_weight=0.0,
    synonyms=False,
    joined_weight=0.0,
    name_bonus=0.0,
    server_boost=0.0,
)


def _step(**changes: Any) -> Tuning:
    return dataclasses.replace(FLOOR, **changes)


STEPS: list[tuple[str, Tuning]] = [
    ("BM25F floor (fields weighted, no stemming, no synonyms)", FLOOR),
    ("+ stemming", _step(stem=True)),
    ("+ words as written beside their stems", _step(stem=True, surface_weight=DEFAULT_TUNING.surface_weight)),
    ("+ synonyms", dataclasses.replace(DEFAULT_TUNING, joined_weight=0.0, name_bonus=0.0, server_boost=0.0)),
    ("+ joined query words", dataclasses.replace(DEFAULT_TUNING, name_bonus=0.0, server_boost=0.0)),
    ("+ name-share bonus", dataclasses.replace(DEFAULT_TUNING, server_boost=0.0)),
    ("+ server-name boost = ToolIndex, lexical alone (the default)", DEFAULT_TUNING),
]
SEMANTIC = {
    "wordllama": "+ WordLlama fused = ToolIndex with search_model: wordllama",
    "minilm": "+ MiniLM transformer fused = ToolIndex with search_model: minilm",
}
SPLITS = ("tuning part", "tuning tasks", "blind part", "independent")
WITHOUT: list[tuple[str, Tuning]] = [
    ("shipped, fields unweighted", dataclasses.replace(DEFAULT_TUNING, weights=(1.0,) * 6)),
    ("shipped, no stemming", dataclasses.replace(DEFAULT_TUNING, stem=False)),
    ("shipped, stems only", dataclasses.replace(DEFAULT_TUNING, surface_weight=0.0)),
    ("shipped, no synonyms", dataclasses.replace(DEFAULT_TUNING, synonyms=False)),
    ("shipped, no joined query words", dataclasses.replace(DEFAULT_TUNING, joined_weight=0.0)),
    ("shipped, no name-share bonus", dataclasses.replace(DEFAULT_TUNING, name_bonus=0.0)),
    ("shipped, no server-name boost", dataclasses.replace(DEFAULT_TUNING, server_boost=0.0)),
]


# --- quality ----------------------------------------------------------------------------------------


class SubstringBaseline:
    """Tools ranked by how many of the query's words (stop words aside) occur in their name + description."""

    def __init__(self, evalset: EvalSet) -> None:
        self.haystacks = [
            (name, f"{name} {tool.get('description') or ''}".lower()) for name, _, tool in evalset.tools()
        ]

    def rank(self, query: str, limit: int = 10) -> list[str]:
        words = {w for w in split_words(query) if w not in STOP_WORDS}
        counted = [(sum(w in hay for w in words), name) for name, hay in self.haystacks]
        counted = [c for c in counted if c[0] > 0]
        counted.sort(key=lambda c: (-c[0], c[1]))
        return [name for _, name in counted[:limit]]


def build(evalset: EvalSet, tuning: Tuning = DEFAULT_TUNING, model: str | None = None) -> ToolIndex:
    index = ToolIndex(tuning=tuning, model=bundled_model(model) if model else None)
    for name, server, tool in evalset.tools():
        index.put(name, server, tool)
    return index


def ranking(index: ToolIndex, accept: Callable[[str], bool] | None = None) -> Callable[[str], list[str]]:
    return lambda query: [h.name for h in index.search(query, 10, accept)]


def quality(evalset: EvalSet, independent: EvalSet) -> dict[str, Any]:
    """Each ranker on the tuning parts, the blind part and the independent set (and the independent set's kinds)."""
    splits: dict[str, tuple[EvalSet, list[Query]]] = {
        "tuning part": (evalset, [q for q in evalset.queries if not q.held_out]),
        "tuning tasks": (evalset, load_tasks()),
        "blind part": (evalset, [q for q in evalset.queries if q.held_out]),
        "independent": (independent, independent.queries),
    }
    for kind in sorted({q.kind for q in independent.queries}):
        splits[f"independent: {kind}"] = (independent, [q for q in independent.queries if q.kind == kind])

    def score(make: Callable[[EvalSet], Callable[[str], Sequence[str]]]) -> dict[str, Any]:
        rankers = {id(evalset): make(evalset), id(independent): make(independent)}
        return {split: evaluate(rankers[id(es)], qs).to_json() for split, (es, qs) in splits.items()}

    rows = [{"ranker": "substring baseline", **score(lambda es: SubstringBaseline(es).rank)}]
    for label, tuning in STEPS + WITHOUT:
        rows.append({"ranker": label, **score(lambda es, t=tuning: ranking(build(es, t)))})  # type: ignore[misc]
    models = [m for m in SEMANTIC if bundled_model(m) is not None]
    for m in models:
        rows.append({"ranker": SEMANTIC[m], **score(lambda es, m=m: ranking(build(es, model=m)))})  # type: ignore[misc]
    best = "minilm" if "minilm" in models else (models[0] if models else None)
    misses = evaluate(ranking(build(independent, model=best)), independent.queries).misses
    return {"rankers": rows, "misses": [{"query": q, "top5": top} for q, top in misses]}


# --- speed ------------------------------------------------------------------------------------------


def replicated(evalset: EvalSet, n: int) -> list[tuple[str, str, dict[str, Any]]]:
    """`n` tools: the catalog again and again, each copy under servers renamed `github0`, `github1`, ..."""
    tools = list(evalset.tools())
    out: list[tuple[str, str, dict[str, Any]]] = []
    copy = 0
    while len(out) < n:
        for name, server, tool in tools:
            renamed = f"{server}{copy}"
            out.append((f"{renamed}__{name.split('__', 1)[1]}", renamed, tool))
        copy += 1
    return out[:n]


def _percentile(sorted_values: Sequence[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def speed(evalset: EvalSet, rounds: int, model: Embedding | None = None) -> dict[str, Any]:
    docs = replicated(evalset, TOOLS_AT_SCALE)
    copies = -(-TOOLS_AT_SCALE // sum(len(s["tools"]) for s in evalset.servers))
    assert copies > VIEW_COPY + 1

    gc.collect()
    index = ToolIndex(model=model)
    started = time.perf_counter()
    for doc in docs:
        index.put(*doc)
    put_s = time.perf_counter() - started
    sample = docs[: len(docs) // 10]
    started = time.perf_counter()
    for doc in sample:
        index.put(*doc)
    replace_s = time.perf_counter() - started

    queries = [q.text for q in evalset.queries]
    # the view: copy 7, whose names sort among the others' (copy 0's would win every tie by name)
    size = sum(len(s["tools"]) for s in evalset.servers)
    in_view = docs[VIEW_COPY * size : (VIEW_COPY + 1) * size]
    view = {server: server.removesuffix(str(VIEW_COPY)) for _, server, _ in in_view}

    def one_copy(name: str) -> bool:
        return name.partition("__")[0] in view

    def original(name: str) -> str:
        server, _, tool = name.partition("__")
        return f"{view[server]}__{tool}"

    latency: dict[str, dict[str, float]] = {}
    for label, accept in (("no filter", None), (f"accept: one copy's tools (1 in {copies})", one_copy)):
        index.search("warm up", 5, accept)
        samples: list[float] = []
        cpu: list[float] = []  # the thread's own CPU time: what a search costs when the machine is busy too
        for _ in range(rounds):
            for q in queries:
                t, c = time.perf_counter(), time.thread_time()
                index.search(q, 5, accept)
                cpu.append(time.thread_time() - c)
                samples.append(time.perf_counter() - t)
        samples.sort()
        cpu.sort()
        latency[label] = {
            "searches": len(samples),
            "p50_ms": _percentile(samples, 0.50) * 1e3,
            "p95_ms": _percentile(samples, 0.95) * 1e3,
            "max_ms": samples[-1] * 1e3,
            "mean_ms": statistics.fmean(samples) * 1e3,
            "cpu_p50_ms": _percentile(cpu, 0.50) * 1e3,
            "cpu_p95_ms": _percentile(cpu, 0.95) * 1e3,
        }
    # the eval queries against the 10,000-tool index, seen through one copy: idf shifts, the filter holds
    scaled = evaluate(lambda q: [original(n) for n in ranking(index, one_copy)(q)], evalset.queries)
    stats = index.stats()

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    measured = ToolIndex(model=model)
    for doc in docs:
        measured.put(*doc)
    gc.collect()
    memory = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(measured) == TOOLS_AT_SCALE

    return {
        "tools": TOOLS_AT_SCALE,
        "semantic": index.semantic,
        "model": model.name if model is not None else "none",
        "copies_of_catalog": copies,
        "index": stats,
        "put_per_s": TOOLS_AT_SCALE / put_s,
        "replace_per_s": len(sample) / replace_s,
        "latency": latency,
        "memory_mib": memory / 2**20,
        "quality_at_scale_through_filter": scaled.to_json(),
    }


# --- the phase --------------------------------------------------------------------------------------


def measure(rounds: int) -> dict[str, Any]:
    evalset, independent = load(), load_independent()
    result = {
        "eval_set": evalset.make_up(),
        "independent_set": independent.make_up(),
        "quality": quality(evalset, independent),
        "speed": speed(evalset, rounds),  # the default: lexical alone
    }
    for name in SEMANTIC:
        model = bundled_model(name)
        if model is not None:
            result[f"speed_{name}"] = speed(evalset, rounds, model)
    return result


def search_phase(bench: Bench) -> None:
    """Measure, keep the figures in the report's extra["search"], and add the headline rows."""
    from bench.run import Row

    rounds = 1 if bench.plan.name == "quick" else 5
    bench.log(f"search: quality on the eval set, then speed at {TOOLS_AT_SCALE} tools ({rounds} rounds)")
    result = measure(rounds)
    bench.extra["search"] = result
    rankers = {r["ranker"]: r for r in result["quality"]["rankers"]}
    ours = rankers[STEPS[-1][0]]  # what a gateway runs unless told otherwise
    base = rankers["substring baseline"]
    goals = (("recall_at_5", "recall@5", 0.9), ("recall_at_1", "recall@1", None), ("mrr", "MRR", None))
    for split in ("blind part", "independent"):
        for key, label, goal in goals:
            b, o = base[split][key], ours[split][key]
            bench.rows.append(
                Row(
                    f"tool search {label}, {split}, {ours[split]['queries']} queries (direct: substring baseline)",
                    f"{b:.3f}",
                    f"{o:.3f}",
                    f"{o - b:+.3f}",
                    f"≥ {goal}" if goal else "(info)",
                    o >= goal if goal else None,
                    {"direct_value": b, "gateway_value": o},
                )
            )
    for key, which in (("speed", "lexical"), ("speed_wordllama", "with WordLlama"), ("speed_minilm", "with MiniLM")):
        if key not in result:
            continue
        speed_ = result[key]
        for label, lat in speed_["latency"].items():
            bench.rows.append(
                Row(
                    f"tool search over {TOOLS_AT_SCALE} tools, {which}, {label}, p50 (p95; CPU p95)",
                    NA,
                    f"{lat['p50_ms']:.2f} ms ({lat['p95_ms']:.2f}; {lat['cpu_p95_ms']:.2f} ms)",
                    NA,
                    "p50 ≤ 5 ms",
                    lat["p50_ms"] <= 5,
                    {"gateway_value": lat["p50_ms"], "p95_ms": lat["p95_ms"], "unit": "ms"},
                )
            )
        bench.rows.append(
            Row(
                f"tool search index memory, {TOOLS_AT_SCALE} tools, {which} (tracemalloc)",
                NA,
                f"{speed_['memory_mib']:.1f} MiB",
                NA,
                "≤ 50 MiB",
                speed_["memory_mib"] <= 50,
                {"gateway_value": speed_["memory_mib"], "unit": "MiB"},
            )
        )


def markdown(result: dict[str, Any]) -> list[str]:
    """The search phase's details: the eval set, every ranker's quality, speed and the remaining misses."""
    make_up = result["eval_set"]
    independent = result["independent_set"]
    lines = [
        "",
        "#### Tool search",
        "",
        f"Eval set (bench/search_eval): {len(make_up['servers'])} real servers, {make_up['tools']} tools, "
        f"{make_up['queries']} labelled queries ({make_up['held_out_queries']} in the frozen blind part), and a "
        f"second tuning part of {result['quality']['rankers'][0]['tuning tasks']['queries']} task-phrased requests. "
        "Independent "
        f"set: {len(independent['servers'])} servers of the compatibility corpus, {independent['tools']} tools, "
        f"{independent['queries']} requests.",
        "",
        "| server | package@version | tools |",
        "|---|---|---|",
    ]
    lines += [f"| {s['name']} | {s['package']}@{s['version']} | {s['tools']} |" for s in make_up["servers"]]
    lines += [
        "",
        "| ranker | tuning R@1 | R@5 | MRR | tuning tasks R@1 | R@5 | MRR | blind R@1 | R@5 | MRR "
        "| independent R@1 | R@5 | MRR |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["quality"]["rankers"]:
        cells = [f"{r[split][key]:.3f}" for split in SPLITS for key in ("recall_at_1", "recall_at_5", "mrr")]
        lines.append(f"| {r['ranker']} | {' | '.join(cells)} |")
    kinds = [k for k in result["quality"]["rankers"][-1] if k.startswith("independent: ")]
    lines += ["", "| independent set, by kind (last ranker) | requests | R@1 | R@5 | MRR |", "|---|---|---|---|---|"]
    for k in kinds:
        q = result["quality"]["rankers"][-1][k]
        lines.append(
            f"| {k.removeprefix('independent: ')} | {q['queries']} | {q['recall_at_1']:.3f} "
            f"| {q['recall_at_5']:.3f} | {q['mrr']:.3f} |"
        )
    for s in (result[key] for key in ("speed", "speed_wordllama", "speed_minilm") if key in result):
        scaled = s["quality_at_scale_through_filter"]
        lines += [
            "",
            f"At {s['tools']} tools ({'with ' + s['model'] if s['semantic'] else 'lexical alone'}; "
            f"{s['copies_of_catalog']} renamed copies of the catalog; {s['index']['terms']} "
            f"terms, {s['index']['postings']} postings): put {s['put_per_s']:.0f} tools/s, replace "
            f"{s['replace_per_s']:.0f}/s, index memory {s['memory_mib']:.1f} MiB. Eval queries through one copy's "
            f"filter: R@1 {scaled['recall_at_1']:.3f}, R@5 {scaled['recall_at_5']:.3f}, MRR {scaled['mrr']:.3f}.",
            "",
            "| search latency | searches | p50 ms | p95 ms | max ms | CPU p50 ms | CPU p95 ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, lat in s["latency"].items():
            lines.append(
                f"| {label} | {lat['searches']} | {lat['p50_ms']:.2f} | {lat['p95_ms']:.2f} | {lat['max_ms']:.2f} "
                f"| {lat['cpu_p50_ms']:.2f} | {lat['cpu_p95_ms']:.2f} |"
            )
    misses = result["quality"]["misses"]
    lines += [
        "",
        f"<details><summary>Independent requests whose tool is not in the first five ({len(misses)})</summary>",
        "",
    ]
    lines += [f"- {m['query']} → {', '.join(m['top5'][:3])}" for m in misses]
    lines += ["", "</details>", ""]
    return lines
