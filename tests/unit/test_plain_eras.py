"""The rule that picks the era of a tool's plain calls from their times (`gateway.upstream.eras`)."""

from __future__ import annotations

from gateway.upstream.eras import (
    BLOCK_SECONDS,
    LEARN_AFTER,
    MARGIN,
    MAX_BLOCKS,
    MAX_TOOLS,
    PER_BLOCK,
    RELEARN_SECONDS,
    SAMPLES,
    WARMUP,
    PlainEras,
    ToolTally,
)


def feed(tally: ToolTally, modern: float, legacy: float) -> bool | None:
    """Answer calls of both eras at fixed times, each from a block of its own, until the tally chooses."""
    chosen = None
    for i in range(WARMUP + SAMPLES):
        block = 2 * (i // PER_BLOCK)
        chosen = tally.add(False, modern, block) if chosen is None else chosen
        chosen = tally.add(True, legacy, block + 1) if chosen is None else chosen
    return chosen


def test_the_eras_take_turns_in_blocks_of_time() -> None:
    eras = PlainEras()
    assert eras.turn(100.0) == (False, 0), "2026 first"
    assert eras.turn(100.0 + BLOCK_SECONDS / 2) == (False, 0)
    assert eras.turn(100.0 + BLOCK_SECONDS) == (True, 1)
    assert eras.turn(100.0 + 3 * BLOCK_SECONDS) == (False, 2)


def test_a_call_is_clean_only_without_the_other_eras_calls_in_flight() -> None:
    eras = PlainEras()
    assert eras.clean(False) and eras.clean(True)
    eras.in_flight[True] += 1  # a 2025 call in flight
    assert eras.clean(True) and not eras.clean(False)


def test_one_block_gives_at_most_half_an_eras_samples() -> None:
    tally = ToolTally()
    for _ in range(WARMUP + SAMPLES):
        tally.add(False, 0.001, block=0)
    assert len(tally.modern) == PER_BLOCK


def test_learning_ends_after_its_blocks() -> None:
    eras = PlainEras()
    eras.turn(0.0)
    tally = ToolTally()
    assert not eras.expired(tally), "not learning yet"
    tally.first_block = eras.block
    for i in range(1, MAX_BLOCKS + 1):
        eras.turn(i * BLOCK_SECONDS)
    assert not eras.expired(tally)
    eras.turn((MAX_BLOCKS + 1) * BLOCK_SECONDS)
    assert eras.expired(tally)


def test_a_chosen_era_is_learned_again_after_a_while() -> None:
    eras = PlainEras()
    tally = eras.tally("echo")
    assert tally is not None
    tally.settle(True, now=100.0)
    assert not tally.stale(100.0 + RELEARN_SECONDS - 1)
    assert tally.stale(100.0 + RELEARN_SECONDS)
    fresh = eras.renew("echo")
    assert fresh.chosen is None and fresh.due(), "due at once: the tool is known to be busy"
    assert eras.tally("echo") is fresh


def test_warm_up_calls_are_not_counted() -> None:
    tally = ToolTally()
    for _ in range(WARMUP):
        assert tally.add(True, 100.0) is None  # a session's first calls pay for opening it
        assert tally.add(False, 0.001) is None
    assert tally.legacy == [] and tally.modern == []
    assert feed(tally, modern=0.002, legacy=0.001) is True
    assert tally.medians_ms == (1.0, 2.0)


def test_the_2025_era_only_when_clearly_faster() -> None:
    assert feed(ToolTally(), modern=0.010, legacy=0.010 * MARGIN) is True
    assert feed(ToolTally(), modern=0.010, legacy=0.010 * MARGIN * 1.05) is False, "a near tie keeps 2026"
    assert feed(ToolTally(), modern=0.001, legacy=0.002) is False


def test_a_choice_is_made_once() -> None:
    tally = ToolTally()
    assert feed(tally, modern=0.002, legacy=0.001) is True
    assert tally.add(False, 0.0) is None and tally.chosen is True
    assert len(tally.legacy) == len(tally.modern) == SAMPLES


def test_tools_past_the_bound_are_not_followed() -> None:
    eras = PlainEras()
    assert all(eras.tally(f"t{i}") is not None for i in range(MAX_TOOLS))
    assert eras.tally("one too many") is None
    assert eras.tally("t0") is not None
    tally = eras.tally("t1")
    assert tally is not None and feed(tally, modern=0.002, legacy=0.001)
    assert eras.chosen() == {"t1": True}


def test_a_tool_is_learned_only_after_its_first_calls() -> None:
    tally = ToolTally()
    assert [tally.due() for _ in range(LEARN_AFTER)] == [False] * LEARN_AFTER
    assert tally.due() and tally.due()
