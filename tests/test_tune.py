"""make tune: the noise rule, the greedy search, Ctrl-C, the overlay it writes, and one real search.

The search logic runs against scripted and fake measurements (no TensorFlow, deterministic),
so the keep/reject rule is tested exactly; one slow test runs the real command on tiny data.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import ROOT, data_sets, run_cli
from train import config
from train.benchmarks import stats
from train.benchmarks.tune import command, overlay, space
from train.benchmarks.tune import search as search_lib
from train.core.errors import UserError

SPREAD = (-1.0, -0.5, 0.0, 0.5, 1.0)  # inclusive quartiles at -0.5 and 0.5: IQR = 1 x the scale


def comparison(gain: float, noise: float, reference_rate: float = 1000.0) -> search_lib.Comparison:
    """Five rounds: A/A ratios with an IQR of `noise`; the candidate `gain` times the same pattern."""
    aa = [1 + noise * d for d in SPREAD]
    return search_lib.Comparison(
        ratios=[gain * r for r in aa],
        aa_ratios=aa,
        reference_rate=reference_rate,
        candidate_rate=reference_rate * gain,
    )


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeMeasure:
    """Speed is a product of factors per knob value; a comparison of 5 rounds of 3 views takes `cost` fake
    seconds (more rounds or more views: longer, in proportion).

    `script` (optional) replaces the model with fixed comparisons, in order; `interrupt_after`
    raises KeyboardInterrupt on that comparison (once), as Ctrl-C would.
    """

    def __init__(self, factors=None, base=None, noise=0.05, cost=20.0, clock=None, script=None, interrupt_after=None):
        self.factors, self.base, self.noise, self.cost = factors or {}, base or {}, noise, cost
        self.clock = clock or FakeClock()
        self.script = list(script or [])
        self.interrupt_after = interrupt_after
        self.calls, self.kept = [], []

    def speed(self, state: dict) -> float:
        rate = 1000.0
        for key, table in self.factors.items():
            rate *= table.get(json.dumps(state.get(key, self.base.get(key))), 1.0)
        return rate

    def compare(self, reference, candidate, rounds, extra=None):
        self.calls.append((dict(reference), dict(candidate)))
        if self.interrupt_after is not None and len(self.calls) == self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt
        self.clock.now += self.cost * rounds * (3 + len(extra or {})) / 15
        if self.script:
            return self.script.pop(0)
        return comparison(self.speed(candidate) / self.speed(reference), self.noise, self.speed(reference))

    def keep_only(self, state):
        self.kept.append(state)


# -- the rule --------------------------------------------------------------------------------------


def test_two_percent_faster_within_five_percent_noise_is_rejected():
    result = comparison(1.02, 0.05)
    verdict = stats.judge(result.ratios, result.aa_ratios)
    assert verdict.noise == pytest.approx(0.05)
    assert verdict.threshold == pytest.approx(1.05)
    assert not verdict.faster and verdict.word == "within noise"


def test_thirty_percent_faster_within_five_percent_noise_is_kept():
    result = comparison(1.30, 0.05)
    verdict = stats.judge(result.ratios, result.aa_ratios)
    assert verdict.faster and verdict.gain.median == pytest.approx(1.30)


def test_a_quiet_machine_still_needs_the_minimum_gain():
    assert not stats.judge(comparison(1.02, 0.0).ratios, [1.0] * 5).faster  # 1 + max(0.03, 0)
    assert stats.judge(comparison(1.05, 0.0).ratios, [1.0] * 5).faster


def test_a_good_median_with_a_lower_quartile_below_one_is_rejected():
    verdict = stats.judge([0.80, 0.95, 1.10, 1.12, 1.15], [1.0, 1.0, 1.0, 1.0, 1.0])
    assert verdict.gain.median > verdict.threshold and verdict.gain.q1 < 1 and not verdict.faster


def test_the_shuffle_floor_is_ten_batches_and_at_least_a_thousand():
    assert space.shuffle_floor(256, 10_000) == 2560
    assert space.shuffle_floor(32, 10_000) == 1000
    assert space.shuffle_floor(256, 600) == 600  # never more than the training split


# -- the search ------------------------------------------------------------------------------------

BASE = {"pipeline.parallel_calls": 1, "pipeline.prefetch": 0, "pipeline.private_threadpool_size": 0}
KNOBS = [
    space.Knob("pipeline.parallel_calls", ["auto", 4]),
    space.Knob("pipeline.prefetch", ["auto"]),
    space.Knob("pipeline.private_threadpool_size", [2]),
]
FACTORS = {
    "pipeline.parallel_calls": {'"auto"': 1.5, "4": 1.48},  # 4 is no better than auto
    "pipeline.prefetch": {'"auto"': 1.3},
    "pipeline.private_threadpool_size": {"2": 1.02},  # within the noise
}


def search(measure, budget_s=1000.0, **kwargs):
    return search_lib.search(
        {},
        KNOBS,
        measure,
        rounds=5,
        deadline=measure.clock.now + budget_s,
        first_guess_s=20.0,
        base=BASE,
        clock=measure.clock,
        say=lambda line: None,
        progress=False,
        **kwargs,
    )


def test_search_recovers_from_a_mis_set_start_and_rejects_noise():
    measure = FakeMeasure(FACTORS, BASE)
    found = search(measure)
    assert found.best == {"pipeline.parallel_calls": "auto", "pipeline.prefetch": "auto"}
    assert found.stopped == "done"
    kept = [(row["knob"], row["value"]) for row in found.trials if row.get("kept")]
    assert kept == [("pipeline.parallel_calls", "auto"), ("pipeline.prefetch", "auto")]
    rejected = {row["value"]: row for row in found.trials if row.get("kept") is False}
    assert set(rejected) == {4, 2}
    # every candidate was measured against the best of its time: each knob's first choice, then the second ones
    auto = {"pipeline.parallel_calls": "auto"}
    assert measure.calls[1] == (auto, {**auto, "pipeline.prefetch": "auto"})
    best = found.best
    assert measure.calls[3] == (best, {**best, "pipeline.parallel_calls": 4})
    assert measure.kept[-1] == found.best  # losers released, the best kept


def test_search_stops_when_the_next_candidate_would_overrun_the_budget():
    """A budget of two candidates measures the first choice of two knobs, not the second choice of the first."""
    measure = FakeMeasure(FACTORS, BASE, cost=20.0)
    found = search(measure, budget_s=50.0)
    assert found.stopped == "budget" and len(measure.calls) == 2 and measure.clock.now <= 50.0
    assert found.best == {"pipeline.parallel_calls": "auto", "pipeline.prefetch": "auto"}


def failing(error: Exception):
    class Failing(FakeMeasure):
        def compare(self, reference, candidate, rounds, extra=None):
            if candidate.get("pipeline.parallel_calls") == "auto":
                raise error
            return super().compare(reference, candidate, rounds, extra)

    return Failing(FACTORS, BASE)


def test_a_candidate_that_cannot_run_here_is_not_kept_and_the_search_goes_on():
    measure = failing(search_lib.CandidateFailed("candidate: ResourceExhaustedError: out of memory"))
    found = search(measure)
    assert found.trials[0]["skipped"].startswith("failed: candidate: ResourceExhaustedError")
    assert measure.calls[0] == ({}, {"pipeline.parallel_calls": 4})  # the knob's next choice takes its turn
    assert found.best == {"pipeline.parallel_calls": 4, "pipeline.prefetch": "auto"}


def test_a_programming_error_stops_the_search_instead_of_failing_a_candidate():
    with pytest.raises(TypeError, match="a bug"):
        search(failing(TypeError("a bug")))


def test_candidates_the_vet_refuses_are_skipped_unmeasured():
    measure = FakeMeasure(FACTORS, BASE)
    found = search(measure, vet=lambda best, cand: "too big" if "pipeline.prefetch" in cand else None)
    assert [row["skipped"] for row in found.trials if "skipped" in row] == ["too big"]
    assert all("pipeline.prefetch" not in cand for _, cand in measure.calls)


# -- run: final check and outputs ------------------------------------------------------------------


def run(measure, tmp_path, base=BASE, knobs=KNOBS, start=None, **kwargs):
    return command.run(
        start or {},
        base,
        knobs,
        measure,
        out=tmp_path / "runs" / "tune",
        tuned_path=tmp_path / "tuned.yaml",
        budget_s=kwargs.pop("budget_s", 1000.0),
        rounds=5,
        final_rounds=9,
        first_guess_s=20.0,
        final_guess_s=30.0,
        facts={"machine": "test machine", "dataset": "tiny", "scenario": "cpu", "config": "optimized"},
        clock=measure.clock,
        say=lambda line: None,
        progress=False,
        **kwargs,
    )


def test_the_final_check_fits_in_the_budget_as_long_as_the_trials_say_it_takes(tmp_path):
    """The final check (9 rounds, 4 views with a reference) takes 2.4 search trials here, more than the first
    guess of 30 s: the search stops early enough for it, so the whole run ends within the budget."""
    measure = FakeMeasure(FACTORS, BASE, cost=20.0)
    result = run(measure, tmp_path, budget_s=100.0, reference={"optimized": {}})
    assert result["final"] is not None and result["seconds"] <= 100.0
    assert len(measure.calls) == 3  # two candidates, then the final check


def test_ctrl_c_keeps_the_best_found_so_far_and_still_checks_it(tmp_path):
    measure = FakeMeasure(FACTORS, BASE, interrupt_after=2)  # Ctrl-C during the second comparison
    result = run(measure, tmp_path)
    assert result["stopped"] == "interrupted"
    assert result["best"] == {"pipeline.parallel_calls": "auto"}
    assert measure.calls[-1] == ({}, {"pipeline.parallel_calls": "auto"})  # the final check: tuned vs start
    assert result["final"]["faster"]
    assert yaml.safe_load((tmp_path / "tuned.yaml").read_text()) == {"pipeline": {"parallel_calls": "auto"}}


def test_ctrl_c_during_the_final_check_writes_with_a_note(tmp_path):
    measure = FakeMeasure(FACTORS, BASE, interrupt_after=5)  # four candidates, then the final check
    result = run(measure, tmp_path)
    assert result["final"] is None and result["note"].startswith("final check interrupted")
    text = (tmp_path / "tuned.yaml").read_text()
    assert "final check interrupted" in text
    assert yaml.safe_load(text) == {"pipeline": {"parallel_calls": "auto", "prefetch": "auto"}}


def test_nothing_is_written_when_tuned_is_not_faster_in_the_final_check(tmp_path):
    earlier = "# an earlier tune\npipeline:\n  prefetch: 2\n"
    (tmp_path / "tuned.yaml").write_text(earlier)
    knobs = [space.Knob("pipeline.parallel_calls", ["auto"])]
    measure = FakeMeasure(script=[comparison(1.3, 0.01), comparison(1.01, 0.04)])
    result = run(measure, tmp_path, knobs=knobs)
    assert result["trials"][0]["kept"] and result["final"] and not result["final"]["faster"]
    assert result["tuned_path"] is None and "not faster" in result["note"]
    assert (tmp_path / "tuned.yaml").read_text() == earlier  # left as it was
    report = json.loads((tmp_path / "runs/tune/tune.json").read_text())
    assert report["overlay"] is None and "not faster" in (tmp_path / "runs/tune/tune.md").read_text()
    assert (tmp_path / "runs/tune/tune.png").stat().st_size > 0


def test_nothing_is_written_when_no_candidate_beats_the_start(tmp_path):
    measure = FakeMeasure(script=[comparison(1.01, 0.02)] * 4)
    result = run(measure, tmp_path)
    assert result["final"] is None and result["tuned_path"] is None
    assert len(measure.calls) == 4  # no final check: there is nothing to check
    assert not (tmp_path / "tuned.yaml").exists()


def test_a_search_that_measured_nothing_does_not_say_no_candidate_was_faster(tmp_path):
    measure = FakeMeasure(FACTORS, BASE)
    result = run(measure, tmp_path, budget_s=40.0)  # 20 s a candidate and 30 s of final check: none fits
    assert result["stopped"] == "budget" and not measure.calls and result["final"] is None
    assert result["note"] == command.NOTHING_MEASURED and "no candidate was measured" in result["note"]


def test_a_budget_that_cannot_hold_one_candidate_is_refused_with_the_minutes_that_would(tmp_path):
    """As measured for the text preset on a 2-core CPU without bf16 units: a 15.8 s trial (whole epochs),
    a 300 s candidate, a 518 s final check: ten minutes hold none of them."""
    command.check_budget(600.0, 40.0, 100.0, 200.0, 5.0)  # fits: no error
    with pytest.raises(UserError) as refused:
        command.check_budget(600.0, 43.7, 300.4, 518.5, 15.8)
    text = str(refused.value)
    assert "--minutes 10 cannot hold one candidate" in text and "15.8 s" in text
    assert 'ARGS="--minutes 25"' in text  # 43.7 + 3 x 300.4 + 518.5 s, in whole minutes


def test_the_overlay_holds_only_changed_knobs_and_loads_through_config_validation(tmp_path):
    preset = ROOT / "configs/optimized.yaml"
    cfg = config.load(preset)
    knobs = [
        space.Knob("pipeline.parallel_calls", [4]),
        space.Knob("pipeline.prefetch", ["auto"]),  # the preset's own value: never a change
        space.Knob("train.steps_per_execution", [16]),
        space.Knob("pipeline.max_intra_op_parallelism", [0]),
    ]
    base = {k.key: space.get(cfg, k.key) for k in knobs}
    measure = FakeMeasure(
        script=[comparison(1.2, 0.01), comparison(1.1, 0.01), comparison(1.0, 0.01)] + [comparison(1.3, 0.01)]
    )
    result = run(measure, tmp_path, base=base, knobs=knobs, start={"pipeline.prefetch": "auto"})
    path = tmp_path / "tuned.yaml"
    assert result["tuned_path"] == str(path)
    assert yaml.safe_load(path.read_text()) == {
        "pipeline": {"parallel_calls": 4},
        "train": {"steps_per_execution": 16},
    }
    header = path.read_text().split("pipeline:")[0]
    for fact in ("test machine", "dataset: tiny", "scenario: cpu", "ex/s", "gain x1.3", "--overlay"):
        assert fact in header
    tuned = config.load(preset, layers=[path])
    assert tuned.pipeline.parallel_calls == 4 and tuned.train.steps_per_execution == 16
    assert tuned.model == cfg.model and tuned.train.epochs == cfg.train.epochs  # what is learned stays


def test_a_ctrl_c_in_the_final_check_writes_whatever_its_note_says(tmp_path, monkeypatch):
    """What is written follows the final check's outcome, never the wording of a message."""
    monkeypatch.setitem(command.NOTES, command.Final.INTERRUPTED, "the check was cut short")
    result = run(FakeMeasure(FACTORS, BASE, interrupt_after=5), tmp_path)
    assert result["final_outcome"] == "interrupted" and result["note"] == "the check was cut short"
    assert yaml.safe_load((tmp_path / "tuned.yaml").read_text()) == {
        "pipeline": {"parallel_calls": "auto", "prefetch": "auto"}
    }


def tuned_result(config_path: str, overrides=(), user_overlays=()):
    return {
        "overlay": {"pipeline": {"parallel_calls": "auto", "cache": "memory"}},
        "tuned_path": "configs/tuned.yaml",
        "scenario_overlays": ["configs/scenarios/cpu.yaml"],
        "user_overlays": list(user_overlays),
        "overrides": list(overrides),
        "config_path": config_path,
    }


def test_the_next_step_trains_the_optimized_preset_with_the_overlay_under_its_scenario():
    line = overlay.train_command(tuned_result("configs/optimized.yaml", ["pipeline.parallel_calls=1", "model.width=8"]))
    assert line == (
        'make train-optimized ARGS="--overlay configs/scenarios/cpu.yaml --overlay configs/tuned.yaml '
        '--set model.width=8"'
    )  # the --set the overlay tuned is left out: it would override the tuned value


def test_the_next_step_trains_the_config_that_was_tuned_not_the_optimized_preset():
    line = overlay.train_command(tuned_result("configs/naive.yaml", ["train.epochs=3"], ["mine.yaml"]))
    assert line.startswith("python -m train fit --config configs/naive.yaml ")
    assert "--overlay mine.yaml --overlay configs/tuned.yaml --set train.epochs=3" in line
    assert "train-optimized" not in line


def test_the_next_step_of_a_text_tune_trains_the_text_preset():
    result = {**tuned_result("configs/text/optimized.yaml"), "workload": "text"}
    result.update(tuned_path="configs/text/tuned.yaml", scenario_overlays=["configs/text/cpu.yaml"])
    line = overlay.train_command(result)
    assert (
        line
        == 'make train-optimized TASK=text ARGS="--overlay configs/text/cpu.yaml --overlay configs/text/tuned.yaml"'
    )
    assert overlay.per_s(result) == "tokens/s" and overlay.per_s(tuned_result("configs/optimized.yaml")) == "ex/s"


def test_read_tuned_flattens_an_overlay(tmp_path):
    path = tmp_path / "tuned.yaml"
    path.write_text("# Written by make tune\n# machine: x\npipeline:\n  cache: memory\ntrain:\n  jit_compile: true\n")
    state, header = overlay.read_tuned(path)
    assert state == {"pipeline.cache": "memory", "train.jit_compile": True}
    assert "machine: x" in header
    assert overlay.nest(state) == {"pipeline": {"cache": "memory"}, "train": {"jit_compile": True}}


# -- the real command ------------------------------------------------------------------------------


def sets(tiny_data_dir, *extra):
    return [arg for item in data_sets(tiny_data_dir) + list(extra) for arg in ("--set", item)]


@pytest.mark.long
def test_tune_finds_a_real_improvement_from_a_mis_set_start_and_a_second_run_starts_from_it(tiny_data_dir, tmp_path):
    out, tuned = tmp_path / "tune", tmp_path / "tuned.yaml"
    mis_set = [
        "pipeline.batch_size=16",
        "pipeline.shuffle_buffer=16",
        "pipeline.parallel_calls=1",
        "pipeline.parallel_reads=1",
        "pipeline.prefetch=0",
        "pipeline.cache=none",
    ]
    common = ["--tuned", str(tuned), "--out", str(out), "--seconds", "0.4", "--trials", "4", "--final-trials", "5"]
    result = run_cli(
        "tune",
        *common,
        "--minutes",
        "1.5",
        "--only",
        "pipeline.cache",
        "--only",
        "train.steps_per_execution",
        *sets(tiny_data_dir, *mis_set),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "tune.json").read_text())
    kept = [row for row in report["trials"] if row.get("kept")]
    assert kept, json.dumps(report["trials"], indent=1)[-3000:]
    assert report["final"]["faster"] and report["final"]["gain"] > 1.03
    assert {row["knob"] for row in report["trials"]} <= {"pipeline.cache", "train.steps_per_execution"}
    written = yaml.safe_load(tuned.read_text())
    assert overlay.flatten(written) == {row["knob"]: row["value"] for row in kept}
    loaded = config.load(ROOT / "configs/optimized.yaml", [s for s in data_sets(tiny_data_dir)], layers=[tuned])
    assert loaded.model.name == "resnet" and loaded.pipeline.random_crop is False
    for name in ("tune.md", "tune.png"):
        assert (out / name).stat().st_size > 0
    assert list((out / "tb").glob("events.out.tfevents.*"))

    # A second tune starts from the overlay; a budget too small for one candidate is refused once the start's
    # trial says so (cb5bb20), with the minutes that would do, and writes nothing.
    before, report_before = tuned.read_text(), (out / "tune.json").read_text()
    again = run_cli("tune", *common, "--minutes", "0.05", *sets(tiny_data_dir, *mis_set), timeout=300)
    assert again.returncode == 2, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"Starting from {tuned}" in again.stdout and "Traceback" not in again.stderr
    assert "--minutes 0.05 cannot hold one candidate" in again.stderr and 'ARGS="--minutes' in again.stderr
    assert tuned.read_text() == before and (out / "tune.json").read_text() == report_before


def test_an_earlier_best_is_not_measured_again():
    knobs = [space.Knob("pipeline.cache", ["memory", "none"])]
    base = {"pipeline.cache": "none"}
    measure = FakeMeasure({"pipeline.cache": {'"memory"': 1.5}}, base)
    found = search_lib.search(
        {}, knobs, measure, rounds=5, deadline=1e9, first_guess_s=1.0, base=base, say=lambda line: None, progress=False
    )
    assert found.best == {"pipeline.cache": "memory"}
    assert len(measure.calls) == 1 and found.trials[1]["skipped"] == "an earlier best, already beaten"
