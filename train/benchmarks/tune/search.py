"""The search loop: a greedy coordinate search, one knob at a time, each candidate against the best.

Two passes over the knobs: the first measures each knob's most promising change (its first
candidate that is not skipped), the second the candidates left. A budget that measures only a
few candidates (ten minutes on two cores measure five to eight) so reaches every knob's likely
win from a mis-set start before it spends time on second choices.

Every candidate is measured against the current best in the same rounds, the best a second time
in each round (A/A), and judged by the benchmarks' one rule (stats.judge): kept only when faster
beyond max(3 %, the A/A noise). The noise pools the best's A/A ratios over every comparison
since it became the best (a rejected candidate's rounds included), so it grows more exact the
longer a best stands. The loop stops when every candidate was tried, when the next one would not
finish before the deadline (the final check's time kept aside), or on Ctrl-C; the best found so
far is returned in every case.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from train.benchmarks import stats
from train.benchmarks.tune.space import Knob


class CandidateFailed(Exception):
    """The candidate cannot run on this machine (out of memory, an XLA compile error, a worker that
    died): recorded as failed and the search goes on. Anything else a measurement raises is a bug
    and stops the search."""


@dataclasses.dataclass
class Comparison:
    ratios: list[float]  # candidate / reference, per round
    aa_ratios: list[float]  # reference again / reference, per round (A/A)
    reference_rate: float  # median examples/s
    candidate_rate: float
    extra: dict = dataclasses.field(default_factory=dict)  # name -> per-round ratios candidate / that variant
    samples: dict = dataclasses.field(default_factory=dict)  # name -> examples/s per round
    process_factor: float | None = None  # a crossed pair's (isolated.Pair); None where not crossed


class Measure(Protocol):
    def compare(self, reference: dict, candidate: dict, rounds: int, extra: dict | None = None) -> Comparison: ...

    def keep_only(self, state: dict | None) -> None: ...


@dataclasses.dataclass
class Search:
    start: dict
    best: dict
    trials: list[dict]
    stopped: str  # done | budget | interrupted
    best_rate: float | None = None
    seconds: float = 0.0


_MISSING = object()


def changes(state: dict, start: dict) -> dict:
    return {key: value for key, value in state.items() if start.get(key, _MISSING) != value}


def short(state: dict) -> str:
    return ", ".join(f"{key.split('.')[-1]}={value}" for key, value in state.items()) or "start"


def fmt(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


class _OutOfBudget(Exception):
    pass


def _passes(knobs: list[Knob], measured: Callable[[Knob, Any], bool]) -> None:
    """Each knob's candidates in order until one is `measured` (skipped ones do not count), then the rest."""
    tried: set[tuple[str, str]] = set()
    for second in (False, True):
        for knob in knobs:
            for value in knob.values:
                key = (knob.key, json.dumps(value))
                if key in tried:
                    continue
                tried.add(key)
                if measured(knob, value) and not second:
                    break


class _Searcher:
    """The state of one search: the best so far, its pooled A/A ratios, the rows, the trial durations."""

    def __init__(self, start, knobs, measure, rounds, deadline, first_guess_s, reserve, vet, base, clock, say):
        self.best, self.aa_pool, self.rows, self.durations, self.beaten = dict(start), [], [], [], []
        self.start, self.measure, self.rounds, self.deadline = start, measure, rounds, deadline
        self.first_guess_s, self.reserve, self.vet, self.base, self.clock, self.say = (
            first_guess_s,
            reserve,
            vet,
            base or {},
            clock,
            say,
        )
        self.best_rate, self.total = None, sum(len(k.values) for k in knobs)

    def estimate(self, done: int) -> str:
        per = statistics.mean(self.durations) if self.durations else self.first_guess_s
        left = min(max(0.0, self.deadline - self.reserve(per) - self.clock()), (self.total - done) * per)
        rate = f"best {self.best_rate:,.0f}/s, " if self.best_rate else ""
        return f"{rate}about {left / 60:.1f} min of search left"

    def same(self, a: dict, b: dict) -> bool:  # a key set to the config's own value is the same as no key
        return changes(a, self.base) == changes(b, self.base)

    def skip_reason(self, candidate: dict) -> str | None:
        if self.same(candidate, self.best):
            return "the current value"
        if any(self.same(candidate, earlier) for earlier in self.beaten):
            return "an earlier best, already beaten"
        return self.vet(self.best, candidate) if self.vet else None

    def fits(self) -> bool:
        # The longest trial so far, not the mean: trials that build a cache take twice as long as others.
        longest = max(self.durations) if self.durations else self.first_guess_s
        mean = statistics.mean(self.durations) if self.durations else self.first_guess_s
        return self.clock() + longest + self.reserve(mean) <= self.deadline

    def measure_one(self, knob: Knob, value, candidate: dict, row: dict, done: int) -> None:
        began = self.clock()
        try:
            result = self.measure.compare(self.best, candidate, self.rounds)
        except CandidateFailed as error:
            row.update(skipped=f"failed: {str(error).splitlines()[0][:200]}")
            self.measure.keep_only(self.best)
        else:
            verdict = stats.judge(result.ratios, self.aa_pool + result.aa_ratios)
            row.update(
                ratios=result.ratios,
                aa_ratios=result.aa_ratios,
                gain=verdict.gain.median,
                q1=verdict.gain.q1,
                q3=verdict.gain.q3,
                noise=verdict.noise,
                threshold=verdict.threshold,
                verdict=verdict.word,
                kept=verdict.faster,
                best_rate=result.reference_rate,
                candidate_rate=result.candidate_rate,
                samples=result.samples,
            )
            if verdict.faster:
                self.beaten.append(self.best)
                self.best, self.aa_pool, self.best_rate = candidate, [], result.candidate_rate
            else:
                self.aa_pool += result.aa_ratios
                self.best_rate = result.reference_rate
            self.measure.keep_only(self.best)
            self.say(
                f"[{done + 1}/{self.total}] {knob.key}: {fmt(row['from'])} -> {fmt(value)}: {verdict.line()}: "
                + ("kept" if verdict.faster else f"not kept ({verdict.word})")
                + f" ({self.estimate(done + 1)})"
            )
        self.durations.append(self.clock() - began)
        row["seconds"] = self.durations[-1]


def search(
    start: dict,
    knobs: list[Knob],
    measure: Measure,
    *,
    rounds: int,
    deadline: float,
    first_guess_s: float,
    reserve: Callable[[float], float] = lambda per_trial_s: 0.0,
    vet: Callable[[dict, dict], str | None] | None = None,
    base: dict | None = None,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = print,
    progress: bool = True,
) -> Search:
    """Greedy coordinate search from `start` (see the module's docstring).

    `reserve(seconds a trial takes)` is kept aside before `deadline` (on `clock`) for the final
    check; `vet(best, candidate)` returns why a candidate is not measured (or None); `base`
    holds the config's own values, for the log. The progress bar shows on a terminal; every
    measured candidate also prints one line with the same progress and estimate.
    """
    from tqdm import tqdm

    began = clock()
    state = _Searcher(start, knobs, measure, rounds, deadline, first_guess_s, reserve, vet, base, clock, say)
    bar = tqdm(
        total=state.total,
        desc="tune",
        unit=" candidates",
        disable=None if progress else True,  # None: only on a terminal
        bar_format="{desc}: {n_fmt}/{total_fmt} candidates |{bar:20}| {elapsed} {postfix}",
    )
    bar.set_postfix_str(state.estimate(0))
    stopped = "done"

    def consider(knob: Knob, value) -> bool:
        candidate = knob.apply(state.best, value)
        row = {
            "trial": len(state.rows) + 1,
            "knob": knob.key,
            "value": value,
            "from": state.best.get(knob.key, state.base.get(knob.key, "(config)")),
            "candidate": changes(candidate, start),
            "why": knob.why,
        }
        reason = state.skip_reason(candidate)
        if reason is not None:
            row["skipped"] = reason
        elif not state.fits():
            raise _OutOfBudget
        else:
            state.measure_one(knob, value, candidate, row, len(state.rows))
        state.rows.append(row)
        bar.update(1)
        bar.set_postfix_str(state.estimate(len(state.rows)))
        return "skipped" not in row  # a failed candidate is no measurement: the knob's next one gets its turn

    try:
        _passes(knobs, consider)
    except _OutOfBudget:
        stopped = "budget"
    except KeyboardInterrupt:
        stopped = "interrupted"
        measure.keep_only(state.best)
        say("Interrupted: the search stops here and keeps the best found so far.")
    finally:
        bar.close()
    return Search(start, state.best, state.rows, stopped, state.best_rate, clock() - began)
