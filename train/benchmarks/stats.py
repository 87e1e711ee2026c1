"""The one statistics rule of every benchmark: what a gain is, what noise is, when a change counts.

- A **gain** of B over A is measured in rounds: both run in the same round (interleaved, order
  rotating), and the round's ratio B / A is paired, so a drift of the machine between rounds hits
  both. The gain is the **median of the per-round ratios**, reported with its quartiles and range;
  never a ratio of two medians taken from different rounds.
- The **noise** is measured, not assumed: the reference measured twice in the same rounds (A/A)
  gives per-round ratios that should all be 1; their interquartile range (or their median's
  distance from 1, where larger) is the noise of that machine at that time.
- A change is **faster** when its median ratio is above 1 + margin and its lower quartile above
  1, **slower** when its median is below 1 / (1 + margin) and its upper quartile below 1, and
  **within noise** otherwise, where margin = max(MIN_GAIN, noise): a 2 % gain on a machine whose
  A/A ratios spread 5 % is not a gain.

bench (speedup, efficiency), the ladder (each rung, the end-to-end figure), tune (each
candidate, the final check), compare and bench-check all use these functions.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

MIN_GAIN = 0.03  # a change must buy at least 3 %, even on a quiet machine
AA_TOLERANCE = 0.03  # an A/A pair must read 1.00 within this (median of its per-round ratios)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile), inclusive method (sensible for 5-9 rounds)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def paired(numerator: list[float], denominator: list[float]) -> list[float]:
    """Per-round ratios numerator / denominator (sample i of each was taken in round i)."""
    return [a / b for a, b in zip(numerator, denominator) if b]


def summarize(samples: list[float]) -> dict:
    """One variant's examples/s over its trials: median, min, max and the samples."""
    return {
        "median": statistics.median(samples) if samples else None,
        "min": min(samples) if samples else None,
        "max": max(samples) if samples else None,
        "trials": len(samples),
        "samples": list(samples),
    }


@dataclasses.dataclass(frozen=True)
class Gain:
    """A paired gain: the median of per-round ratios, with quartiles and range."""

    ratios: tuple[float, ...]
    median: float
    q1: float
    q3: float
    low: float
    high: float

    @classmethod
    def of(cls, ratios: list[float]) -> Gain:
        if not ratios:
            nan = float("nan")
            return cls((), nan, nan, nan, nan, nan)
        q1, median, q3 = quartiles(list(ratios))
        return cls(tuple(ratios), median, q1, q3, min(ratios), max(ratios))

    def text(self, digits: int = 2) -> str:
        return f"x{self.median:.{digits}f} (quartiles {self.q1:.{digits}f}-{self.q3:.{digits}f})"

    def as_dict(self) -> dict:
        return {
            "median": self.median,
            "q1": self.q1,
            "q3": self.q3,
            "min": self.low,
            "max": self.high,
            "ratios": list(self.ratios),
        }


def gain(numerator: list[float], denominator: list[float]) -> Gain:
    return Gain.of(paired(numerator, denominator))


def noise(aa_ratios: list[float]) -> float:
    """How far A/A ratios (a variant against itself, same rounds) stray from 1: their interquartile
    range, or the distance of their median from 1 where that is larger (a pair whose ratios agree
    with each other but not with 1 is not a quiet machine)."""
    if not aa_ratios:
        return 0.0
    q1, median, q3 = quartiles(list(aa_ratios))
    return max(q3 - q1, abs(median - 1.0))


def margin(aa_ratios: list[float], min_gain: float = MIN_GAIN) -> float:
    """How far from 1 a gain must be to count: max(min_gain, the A/A noise)."""
    return max(min_gain, noise(aa_ratios))


@dataclasses.dataclass(frozen=True)
class Verdict:
    gain: Gain
    noise: float
    threshold: float  # 1 + margin: what the median must beat to be faster

    @property
    def faster(self) -> bool:
        return self.gain.median > self.threshold and self.gain.q1 > 1.0

    @property
    def slower(self) -> bool:
        return self.gain.median < 1.0 / self.threshold and self.gain.q3 < 1.0

    @property
    def word(self) -> str:
        return "faster" if self.faster else "slower" if self.slower else "within noise"

    def line(self) -> str:
        g = self.gain
        return (
            f"x{g.median:.3f} (quartiles {g.q1:.3f}-{g.q3:.3f}; A/A noise {self.noise:.3f}, "
            f"needs > {self.threshold:.3f} and lower quartile > 1)"
        )

    def as_dict(self) -> dict:
        return {**self.gain.as_dict(), "noise": self.noise, "threshold": self.threshold, "verdict": self.word}


def judge(ratios: list[float], aa_ratios: list[float], min_gain: float = MIN_GAIN) -> Verdict:
    """Faster, slower or within noise: see the module's docstring."""
    return Verdict(Gain.of(ratios), noise(aa_ratios), 1.0 + margin(aa_ratios, min_gain))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """A plain ratio of two single figures (compare: one run each, not paired rounds)."""
    if numerator and denominator:
        return numerator / denominator
    return None


def agree(first: float, second: float, tolerance: float) -> bool:
    """Two estimates of one gain agree when they differ by at most `tolerance` (relative, symmetric)."""
    return abs(math.log(first / second)) <= math.log1p(tolerance)
