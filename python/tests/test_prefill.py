"""kvc.prefill: the server's prefill learnt from its steps, and a target
rescaled to it."""

from __future__ import annotations

import pytest

from kvc.prefill import (LoadClock, PrefillClock, mean_first_token,
                         scaled_target)


def test_fits_the_steps_it_saw() -> None:
    clock = PrefillClock(min_samples=3)
    assert clock.seconds(100) is None and not clock.ready
    for tokens in (100, 200, 400, 800):
        clock.observe(tokens, 0.002 + 1e-4 * tokens)
    assert clock.ready
    assert clock.seconds(600) == pytest.approx(0.062)
    assert clock.seconds(0) == 0.0
    assert clock.typical_tokens() == 375


def test_a_size_is_as_fast_as_its_fastest_step() -> None:
    clock = PrefillClock(min_samples=3)
    for tokens in (100, 200, 400):
        clock.observe(tokens, 0.004 + 2e-4 * tokens)  # first sight: slow
    for tokens in (100, 200, 400, 200):
        clock.observe(tokens, 0.002 + 1e-4 * tokens)
    clock.observe(400, 0.5)  # slowed by something else
    assert clock.seconds(800) == pytest.approx(0.082)


def test_needs_more_than_one_size_and_a_positive_slope() -> None:
    clock = PrefillClock(min_samples=2)
    clock.observe(256, 0.01)
    clock.observe(256, 0.02)
    assert not clock.ready  # one size: no slope
    clock = PrefillClock(min_samples=2)
    clock.observe(100, 0.02)
    clock.observe(200, 0.01)
    assert not clock.ready  # noise: shorter steps took longer
    clock.observe(0, 1.0)  # ignored
    assert clock.steps == 2


def test_a_stalled_step_does_not_tilt_the_fit() -> None:
    clock = PrefillClock(min_samples=3)
    for tokens in (100, 200, 300, 400, 500, 600, 700):
        clock.observe(tokens, 0.002 + 1e-4 * tokens)
    clock.observe(800, 3 * (0.002 + 1e-4 * 800))  # the host stalled
    # A least-squares line through these prices 800 tokens 83% high.
    assert clock.seconds(800) == pytest.approx(0.082, rel=0.02)
    assert clock.seconds(100) == pytest.approx(0.012, rel=0.02)


def test_prefers_steps_no_save_ran_beside() -> None:
    clock = PrefillClock(min_samples=3)
    for tokens in (300, 400, 500, 600):  # saves beside: twice as slow
        clock.observe(tokens, 2e-4 * tokens, clean=False)
    assert clock.seconds(1000) == pytest.approx(0.2)  # all there is
    for tokens in (100, 200):
        clock.observe(tokens, 1e-4 * tokens)
    assert clock.seconds(1000) > 0.15  # too few clean: all of them
    clock.observe(300, 1e-4 * 300)
    assert clock.seconds(1000) == pytest.approx(0.1)  # the clean ones
    assert [clean for _, _, clean in clock.samples] == [False] * 4 + [True] * 3


def test_keeps_the_recent_steps() -> None:
    clock = PrefillClock(samples=4, min_samples=2)
    for tokens in (100, 200, 300, 400):
        clock.observe(tokens, 1e-3 * tokens)
    for tokens in (100, 200, 300, 400):
        clock.observe(tokens, 2e-3 * tokens)
    assert clock.seconds(1000) == pytest.approx(2.0)


def test_scaled_target() -> None:
    target = {"name": "cpu", "compute": {"dense_tflops": 1.0, "mem_gbs": 10.0,
                                         "kind": "cpu"}, "tiers": [{"a": 1}]}
    scaled = scaled_target(target, 0.5)
    assert scaled["compute"] == {"dense_tflops": 0.5, "mem_gbs": 5.0,
                                 "kind": "cpu"}
    assert scaled["tiers"] == target["tiers"]
    assert target["compute"]["dense_tflops"] == 1.0  # not changed
    with pytest.raises(ValueError):
        scaled_target(target, 0)


def test_load_clock_is_the_median_ratio_once_seen() -> None:
    clock = LoadClock(samples=4, min_samples=2)  # (1 by default)
    assert clock.ratio == 1.0
    clock.observe(0.010, 0.030)
    assert clock.ratio == 1.0  # one step: not yet
    clock.observe(0.010, 0.020)
    assert clock.ratio == pytest.approx(2.5)
    clock.observe(0.010, 0.100)  # an outlier moves the median little
    assert clock.ratio == pytest.approx(3.0)
    clock.observe(0.0, 1.0)  # ignored
    assert clock.steps == 3
    for _ in range(4):
        clock.observe(0.010, 0.010)
    assert clock.ratio == pytest.approx(1.0)  # the recent ones


def _per_token(tokens: int) -> float:
    return 0.001 * tokens


def test_mean_first_token_of_prefills_in_budgeted_steps() -> None:
    # One request: its prefill.
    assert mean_first_token([(300, 0.0)], 1000, _per_token) == \
        pytest.approx(0.3)
    # Three of 300 tokens in steps of 400 tokens: the second is split
    # across the first two steps and first in the second, the third across
    # the second and third; first tokens at the ends of steps 1, 2 and 3
    # (0.4 s, 0.4 s and 0.1 s).
    assert mean_first_token([(300, 0.0)] * 3, 400, _per_token) == \
        pytest.approx((0.4 + 0.8 + 0.9) / 3)
    assert mean_first_token([], 400, _per_token) == 0.0


def test_a_load_holds_up_its_whole_step() -> None:
    # A load joins the step it is taken in: the prefill beside it finishes
    # after it too (its own tokens are in its seconds, not the budget's
    # time).
    assert mean_first_token([(10, 0.05), (300, 0.0)], 1000, _per_token) == \
        pytest.approx(0.35)
    # A load taken in a later step holds up that step only.
    assert mean_first_token([(300, 0.0), (10, 0.05)], 300, _per_token) == \
        pytest.approx((0.3 + 0.35) / 2)
    # Every load of a step before any of its first tokens.
    assert mean_first_token([(10, 0.05)] * 4, 1000, _per_token) == \
        pytest.approx(0.2)
