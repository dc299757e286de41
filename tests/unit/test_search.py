"""The tool search index: words, incremental changes, filters, limits, bounds, and quality on the eval set."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.search_eval import evaluate, load
from gateway.search import MAX_QUERY_TERMS, SYNONYM_GROUPS, Hit, ToolIndex, split_words, stem


def _tool(description: str = "", **extra) -> dict:
    return {"name": "ignored", "description": description, "inputSchema": {"type": "object"}, **extra}


def _names(hits: list[Hit]) -> list[str]:
    return [h.name for h in hits]


@pytest.fixture
def index() -> ToolIndex:
    idx = ToolIndex()
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
    terms = ToolIndex().query_terms("take a picture of the page")
    assert terms[stem("picture")] == 1.0
    assert terms[stem("page")] == 1.0
    assert "the" not in terms and "a" not in terms
    assert 0 < terms[stem("screenshot")] < 1.0


def test_query_terms_join_adjacent_words():
    assert stem("todo") in ToolIndex().query_terms("what is on my to-do list")


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
    assert index.stats() == {"tools": 0, "terms": 0, "postings": 0}
    assert index.search("issue") == []


def test_public_name_and_catalog_metadata_do_not_count_the_server_twice():
    """A tool as the gateway publishes it: `name` is the public name, the original sits in `_meta`."""
    published = ToolIndex()
    published.put("s__get_file", "s", {"name": "s__get_file", "_meta": {"manifold/tool": "get.file"}})
    raw = ToolIndex()
    raw.put("s__get_file", "s", {"name": "get_file"})
    assert published.search("get the file") == raw.search("get the file")


def test_renamed_tool_is_found_by_its_original_name_too():
    idx = ToolIndex()
    idx.put("s__fetch_page", "s", {"name": "s__fetch_page", "_meta": {"manifold/tool": "downloadDocument"}})
    assert _names(idx.search("download document")) == ["s__fetch_page"]


def test_parameters_are_indexed():
    idx = ToolIndex()
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
    idx = ToolIndex()
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
def test_incremental_changes_match_a_fresh_build(ops):
    """Any run of puts and removes ranks exactly as an index built from the surviving tools alone."""
    idx = ToolIndex()
    alive: dict[str, str] = {}
    for is_put, n, words in ops:
        name = f"s{n % 3}__tool{n}"
        if is_put:
            idx.put(name, f"s{n % 3}", _tool(f"{words} number {n}"))
            alive[name] = words
        else:
            idx.remove(name)
            alive.pop(name, None)
    fresh = ToolIndex()
    for name, words in sorted(alive.items(), key=lambda kv: kv[0]):
        n = int(name.rsplit("tool", 1)[1])
        fresh.put(name, f"s{n % 3}", _tool(f"{words} number {n}"))
    assert len(idx) == len(fresh)
    for query in ("issue", "screenshot of the page", "text file number 3", "s1"):
        assert idx.search(query, 10) == fresh.search(query, 10)


# --- search options ---


def test_accept_filter_is_never_bypassed(index):
    only_gitlab = lambda name: name.startswith("gitlab__")  # noqa: E731
    for query in ("create an issue", "screenshot", "github issue", "time"):
        assert all(n.startswith("gitlab__") for n in _names(index.search(query, 10, accept=only_gitlab)))
    assert index.search("anything at all", 5, accept=lambda _: False) == []


def test_accept_reaches_past_many_rejected_candidates():
    idx = ToolIndex()
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
    assert ToolIndex().search("anything") == []


def test_results_are_best_first_and_ties_go_by_name():
    idx = ToolIndex()
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
    idx = ToolIndex()
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


def test_recall_at_5_on_the_eval_set():
    evalset = load()
    idx = ToolIndex()
    for name, server, tool in evalset.tools():
        idx.put(name, server, tool)
    quality = evaluate(lambda q: _names(idx.search(q, 10)), evalset.queries)
    assert quality.queries >= 150
    assert quality.recall_at_5 >= 0.9, quality.misses


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16 - 1), st.integers(1, 8), st.sampled_from(["create issue", "read file", "page", "s3"]))
def test_a_filtered_search_is_the_unfiltered_ranking_filtered(mask, limit, query):
    """Whatever share of tools `accept` keeps, the result is the full ranking with the rest struck out."""
    idx = ToolIndex()
    words = ["create an issue", "read a file", "screenshot of a page", "issue in a file", "page file issue"]
    for i in range(16):
        idx.put(f"s{i % 4}__tool{i:02}", f"s{i % 4}", _tool(f"{words[i % 5]} {i}"))
    accept = lambda name: bool(mask >> int(name[-2:]) & 1)  # noqa: E731
    everything = idx.search(query, 100)
    assert idx.search(query, limit, accept) == [h for h in everything if accept(h.name)][:limit]
