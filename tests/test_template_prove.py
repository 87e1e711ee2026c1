"""`make prove`: the doctor's fixes for a template run, each measured as a ladder rung (train/benchmarks/prove.py).

Which rung makes which fix, what needs --allow and what the optimized preset sets that no proved fix made are tested
on recommendations and configs built here (fast); the command once end to end on the tiny dataset (long): a
compare's naive run diagnosed, its fixes measured in paired rounds, the optimized preset beside them.
"""

from __future__ import annotations

import json

import pytest

from step_doctor.diagnose.recommendation import SPEED, Recommendation
from tests.conftest import ROOT, SHORT_RUN, data_sets, run_cli
from train import config
from train.benchmarks import ladder, prove
from train.benchmarks.tune.overlay import flatten


def rec(cause: str, gain: float = 1.5, estimates: dict | None = None, stage: str | None = "Iterator::Root::Map"):
    return Recommendation(cause, cause, SPEED, 10.0, 1.0, gain, "evidence", "fix", stage=stage, estimates=estimates)


class Diagnosed:
    def __init__(self, *recommendations):
        self.recommendations = recommendations


RUNGS = {rung["name"]: rung for rung in ladder.load_ladder(ROOT / "configs/ladder/ladder.yaml")["rungs"]}


def test_each_fix_is_the_rung_that_makes_it_and_what_changes_what_is_learned_needs_allow():
    item = Diagnosed(
        rec("python-generator", 1.5),
        rec("sequential-map", 5.0, {"parallel-calls": 1.02, "cache": 5.0}),
        rec("no-prefetch", 1.2),
        rec("small-batch", 1.1, stage=None),
        rec("slow-stage", 1.3),
    )
    made = prove.plan(item, RUNGS, allow=set())
    assert [(c.rung, c.estimated_gain) for c in made.candidates] == [
        ("parallel map", 1.02),
        ("cache", 5.0),
        ("prefetch", 1.2),
    ]
    assert made.candidates[1].state == RUNGS["cache"]["set"]
    refused = {r["cause"]: r["why"] for r in made.refused}
    assert "--allow generator" in refused["python-generator"] and "--allow batch" in refused["small-batch"]
    assert refused["slow-stage"] == "no knob of this template makes this fix"
    allowed = prove.plan(item, RUNGS, allow={"generator", "batch"})
    assert {c.rung for c in allowed.candidates} >= {"tfrecord + interleave", "larger batch"}


def test_a_cause_that_offers_no_cache_is_not_measured_with_one():
    made = prove.plan(Diagnosed(rec("heavy-map", 1.4, {"parallel-calls": 1.4})), RUNGS, allow=set())
    assert [c.rung for c in made.candidates] == ["parallel map"]


def test_the_optimized_preset_as_an_overlay_of_naive_and_what_no_proved_fix_made(tmp_path):
    sets = data_sets(tmp_path)
    naive = config.load(ROOT / "configs/naive.yaml", sets)
    optimized = config.load(ROOT / "configs/optimized.yaml", sets)
    overlay = prove.preset_as_overlay(naive, optimized)
    assert overlay["pipeline.reader"] == "tfrecord" and overlay["pipeline.batch_size"] == 256
    assert not any(key.startswith(("name", "description", "model.")) for key in overlay)
    assert config.load(ROOT / "configs/naive.yaml", sets + [f"{k}={v}" for k, v in overlay.items()]).pipeline == (
        optimized.pipeline
    )
    made = prove.plan(Diagnosed(rec("python-generator"), rec("no-prefetch")), RUNGS, allow=set())
    made.candidates[0].verdict = None
    made.candidates[0].why = "out of memory"
    values = flatten(config.to_dict(naive))
    not_made = prove._not_made({"pipeline.prefetch": "auto"}, overlay, made, RUNGS, values)
    missing = {d["key"]: d["why"] for d in not_made}
    assert {d["key"]: d["run"] for d in not_made}["pipeline.batch_size"] == 32  # the run's own value
    assert "pipeline.prefetch" not in missing
    assert "--allow generator" in missing["pipeline.reader"]
    assert "did not name the cache rung" in missing["pipeline.cache"]
    assert missing["pipeline.scaled_decode"] == "no ladder rung sets it (the optimized preset's own choice)"
    assert "vectorized augmentation" in missing["pipeline.augment"]  # the rung that sets batched, not per_example


def test_a_run_that_is_not_a_template_run_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(prove.UserError, match="Run `make compare` first"):
        prove.run_diagnosis(tmp_path)


@pytest.mark.long
def test_prove_measures_the_naive_runs_fixes_and_the_optimized_preset_beside_them(tiny_data_dir, tmp_path):
    sets = [a for item in data_sets(tiny_data_dir) + SHORT_RUN for a in ("--set", item)]
    compared = run_cli("compare", "--out", str(tmp_path / "compare"), *sets, timeout=600)
    assert compared.returncode == 0, compared.stdout[-2000:] + compared.stderr[-2000:]
    out = tmp_path / "prove"
    args = ["--run", str(tmp_path / "compare" / "naive"), "--allow", "generator,batch", "--out", str(out)]
    done = run_cli("prove", *args, "--passes", "2", "--trials", "2", "--seconds", "0.3", *sets, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "prove.json").read_text())
    fixes = result["fixes"]
    assert fixes and {f["rung"] for f in fixes} <= set(RUNGS), fixes
    for fix in fixes:  # measured, or said why not
        assert fix["verdict"] in ("faster", "slower", "within noise") or fix["why"], fix
    assert any("measured" in f for f in fixes), fixes
    if any(f["verdict"] == "faster" for f in result["fixes"] if f["pass"] == 1):  # profiled again with them
        assert (out / "pass-2" / "summary.json").is_file()
    assert result["optimized"]["measured"]["median"] > 1.0 and result["cpu"]["model"]
    assert "The proved fixes reach" in done.stdout or "Nothing proved" in done.stdout
    assert all(d["why"] for d in result["not_made"]) and (out / "prove.md").read_text().startswith("| pass")


def test_a_later_rung_that_would_undo_a_proved_key_or_changes_nothing_is_not_measured():
    class Unmeasured:
        def compare(self, *args, **kwargs):
            raise AssertionError("measured")

        def keep_only(self, state):
            pass

    state = {"pipeline.augment": "batched", "pipeline.prefetch": "auto"}
    rung = "tfrecord + interleave"
    undoing = prove.Candidate(rung, ["python-generator"], 1.5, dict(RUNGS[rung]["set"]))
    prove._measure_on(undoing, state, Unmeasured(), rounds=2)
    assert undoing.why == "it would undo pipeline.augment of the fixes proved before it" and undoing.verdict is None
    same = prove.Candidate("prefetch", ["no-prefetch"], 1.2, {"pipeline.prefetch": "auto"})
    prove._measure_on(same, state, Unmeasured(), rounds=2)
    assert same.why == "the fixes proved before it set it already"
