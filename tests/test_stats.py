"""The one statistics rule of the benchmarks (train/benchmarks/stats.py) and what bench and the ladder do with it."""

from __future__ import annotations

import pytest

from train.benchmarks import ladder, stats


def test_a_gain_is_the_median_of_per_round_ratios_not_a_ratio_of_medians():
    # Round 3 is slow for both variants (a drift of the machine): paired ratios ignore it.
    base = [100.0, 100.0, 50.0, 100.0, 100.0]
    faster = [120.0, 118.0, 60.0, 121.0, 119.0]
    gain = stats.gain(faster, base)
    assert gain.median == pytest.approx(1.2) and gain.q1 == pytest.approx(1.19) and gain.q3 == pytest.approx(1.2)
    assert stats.ratio(119.0, 100.0) == pytest.approx(1.19)  # the medians' ratio differs
    assert gain.low == pytest.approx(1.18) and gain.high == pytest.approx(1.21)


def test_noise_is_the_spread_of_aa_ratios_or_their_distance_from_one():
    assert stats.noise([0.98, 1.0, 1.02, 0.99, 1.01]) == pytest.approx(0.02)
    # ratios that agree with each other but not with 1: the pair is biased, that is noise too
    assert stats.noise([1.10, 1.11, 1.10, 1.09, 1.10]) == pytest.approx(0.10)
    assert stats.noise([]) == 0.0


@pytest.mark.parametrize(
    ("ratios", "word"),
    [
        ([1.20, 1.22, 1.18, 1.21, 1.19], "faster"),
        ([1.02, 1.01, 1.03, 1.00, 1.02], "within noise"),  # +2 %: under the 3 % floor
        ([0.80, 0.82, 0.79, 0.81, 0.80], "slower"),
        ([1.30, 0.90, 1.25, 0.95, 1.28], "within noise"),  # a good median, but a lower quartile below 1
    ],
)
def test_judge_calls_a_change_faster_slower_or_within_noise(ratios, word):
    assert stats.judge(ratios, [1.0, 1.0, 1.0, 1.0, 1.0]).word == word


def test_a_gain_within_the_measured_noise_is_not_a_gain():
    aa = [0.94, 1.0, 1.06, 0.97, 1.03]  # IQR 0.06
    assert stats.judge([1.05, 1.04, 1.06, 1.05, 1.05], aa).word == "within noise"
    assert stats.judge([1.10, 1.09, 1.11, 1.10, 1.10], aa).word == "faster"


def test_two_estimates_agree_within_a_relative_tolerance_either_way():
    assert stats.agree(1.00, 1.025, 0.03) and stats.agree(1.025, 1.00, 0.03)
    assert not stats.agree(1.00, 1.04, 0.03)
    assert not stats.agree(0.52, 1.00, 0.10)  # the old harness: encoded cache as candidate vs as base


def row(gain: float, verdict: str, kept: bool = True) -> dict:
    return {"gain": gain, "verdict": {"verdict": verdict}, "kept": kept}


def test_the_ladders_cumulative_line_multiplies_only_gains_beyond_the_noise():
    rows = [row(2.0, "faster"), row(1.01, "within noise"), row(0.98, "within noise"), row(1.5, "faster")]
    rows += [row(0.5, "slower", kept=False), {"name": "skipped", "kept": False, "skipped": "one device"}]
    assert ladder.cumulative(rows) == pytest.approx(3.0)
    assert [r["cumulative_speedup"] for r in rows] == pytest.approx([2.0, 2.0, 2.0, 3.0, 3.0, 3.0])


def test_a_rung_kept_only_if_faster_is_not_kept_on_a_ratio_within_noise():
    within = stats.judge([1.01, 1.02, 1.01, 1.00, 1.01], [1.0] * 5)
    faster = stats.judge([1.20, 1.21, 1.19, 1.20, 1.20], [1.0] * 5)
    assert not ladder.keeps("if_faster", within) and ladder.keeps("if_faster", faster)
    assert ladder.keeps("always", within)  # an always rung carries forward, marked within noise
    assert ladder.kept_word(True, within) == "yes (within noise)"
    assert ladder.kept_word(False, within) == "no (within noise)"
