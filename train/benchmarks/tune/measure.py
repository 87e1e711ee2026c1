"""The measuring adapter: Measure.compare() on real variants, each in its own process (isolated.py).

One variant per state, kept alive only while it is the best (a loser's process ends at once, so
memory does not grow). The best is measured twice per round under two names: its A/A pair.
A variant that cannot run here (isolated.VariantFailed: out of memory, an op or XLA compile
error, a worker that died) or whose config this machine refuses (UserError) is a failed
candidate; a programming error in a worker (isolated.WorkerBug) is raised as it is.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

from train.benchmarks import isolated, stats
from train.benchmarks.tune.search import CandidateFailed, Comparison
from train.core.errors import UserError

MIN_CALLS = 6  # a trial lasts --seconds and at least this many executions (slow pipelines: longer trials)


class TrialMeasure:
    def __init__(self, load: Callable[[dict], object], seconds: float):
        self.load, self.seconds = load, seconds
        self.alive: dict[str, isolated.IsolatedVariant] = {}

    @staticmethod
    def _key(state: dict) -> str:
        return json.dumps(state, sort_keys=True)

    def variant(self, state: dict, name: str = "tune", log: Callable[[str], None] | None = None):
        key = self._key(state)
        if key not in self.alive:
            try:
                self.alive[key] = isolated.IsolatedVariant(name, self.load(state), log=log)
            except (isolated.VariantFailed, UserError) as error:
                raise CandidateFailed(str(error)) from None
        return self.alive[key]

    def compare(self, reference: dict, candidate: dict, rounds: int, extra: dict | None = None) -> Comparison:
        best = self.variant(reference, "reference")
        cand = self.variant(candidate, "candidate")
        if not extra:
            try:
                pair = isolated.pair_round(best, cand, rounds, self.seconds, log=lambda line: None, min_calls=MIN_CALLS)
            except isolated.VariantFailed as error:
                raise CandidateFailed(str(error)) from None
            return Comparison(
                ratios=pair.ratios,
                aa_ratios=pair.aa_ratios,
                reference_rate=statistics.median(pair.base),
                candidate_rate=statistics.median(pair.candidate),
                samples=pair.samples,
                process_factor=pair.process_factor,
            )
        return self._compare_with(best, cand, rounds, extra)

    def _compare_with(self, best, cand, rounds: int, extra: dict) -> Comparison:
        """The final check with reference presets: best, candidate, best again and each reference in one
        rotation (three or more processes, so no trial follows one of the same process)."""
        views = [best.view("best"), cand.view("candidate"), best.view("best again")]
        others = []
        try:
            for name, cfg in extra.items():
                others.append(isolated.IsolatedVariant(name, cfg, log=None))
            isolated.interleaved(views + others, rounds, self.seconds, log=lambda line: None, min_calls=MIN_CALLS)
        except isolated.VariantFailed as error:
            raise CandidateFailed(str(error)) from None
        finally:
            isolated.close_all(others)
        first, candidate, again = views
        return Comparison(
            ratios=stats.paired(candidate.samples, first.samples),
            aa_ratios=stats.paired(again.samples, first.samples),
            reference_rate=statistics.median(first.samples),
            candidate_rate=statistics.median(candidate.samples),
            extra={other.name: stats.paired(candidate.samples, other.samples) for other in others},
            samples={view.name: list(view.samples) for view in views + others},
        )

    def keep_only(self, state: dict | None) -> None:
        keep = None if state is None else self._key(state)
        for key in [key for key in self.alive if key != keep]:
            self.alive.pop(key).close()

    def close(self) -> None:
        self.keep_only(None)
