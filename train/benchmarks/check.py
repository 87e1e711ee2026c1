"""`make bench-check`: can this machine's benchmark figures be trusted? Two checks per scenario.

- **A/A**: the same config measured as two variants (two processes) must read 1.00 within
  +-3 % (median of the per-round ratios), in each pairing the benchmarks use: bench's (two
  fresh variants in the same rounds), the ladder's (a long-running base against a fresh
  candidate) and tune's (TrialMeasure.compare, its trial lengths). Every pairing renews each
  process's pipeline before its rounds (isolated.interleaved), and is crossed
  (isolated.pair_round): half its rounds with each config in its own process, half with each in
  the other's, so what belongs to a process (its age, its order of creation) cancels. Each
  pairing measures both twice a round, alternating; the first variant's two trials give the
  noise of that moment (`within_noise`: the A/A median lies within max(3 %, that noise)). Each
  also reports how far apart its two processes ran (`process_factor`, from the two halves): what
  the crossing cancelled. What it leaves is the part of that factor that changed between halves.
  A failed row is read as a bias (its quartiles wholly outside the band) or as that run's noise
  (`reading`): a machine too noisy to tell is not a harness to fix.
- **order**: a rung's gain measured with it as the fresh candidate against the long-running
  base, and again with it as the long-running base against the fresh rung before it, must
  agree within max(3 %, the A/A noise of either run). The rung is the ladder file's
  `order_check` (the encoded cache of the larger-than-memory ladder: 1,229 ex/s as the
  candidate and 1,500-2,900 as the base under the old harness).

Writes runs/bench-check/check.json and check.md with the CPU (its model, whether it has bfloat16
units) and the machine's load (os.getloadavg, what `uptime` prints) before and after; exits 1
when a check fails.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from step_doctor import machine
from train import scenario as scenario_lib
from train.benchmarks import isolated, ladder, stats, trials
from train.benchmarks.options import BenchOptions, CheckOptions, LadderOptions, Trials, TuneOptions
from train.benchmarks.tune.measure import TrialMeasure
from train.benchmarks.tune.overlay import as_sets
from train.benchmarks.tune.search import Comparison
from train.core import files


def aa_result(ratios: list[float], repeat_ratios: list[float], process_factor: float, samples: dict) -> dict:
    """The A/A pair's gain (its per-round ratios, crossed: isolated.pair_round), the first's own repeat noise, how
    far apart its two processes ran (what the crossing cancelled: isolated.Pair.process_factor), and the
    verdicts. Every trial's examples/s goes into check.json too (first half's rounds, then the second's), so a
    reading can be taken apart afterwards without running the check again."""
    pair = stats.Gain.of(ratios)
    noise = stats.noise(repeat_ratios)
    result = {
        **pair.as_dict(),
        "noise": noise,
        "process_factor": process_factor,
        "passed": abs(pair.median - 1.0) <= stats.AA_TOLERANCE,
        "within_noise": abs(pair.median - 1.0) <= max(stats.AA_TOLERANCE, noise),
        "samples": samples,
    }
    return {**result, "reading": reading(result)}


def failure(aa: dict) -> str | None:
    """What failed in an A/A row (None where it passed): "bias" where its quartiles lie wholly outside 1.00 +-3 % (as
    a fresh process's 4-6 % lead did on the Intel kind, 2026-12-05), "noise" where its median lies within the repeat
    noise of that very run, wider than the band (the run could not tell a 3 % bias from none), else "unexplained"."""
    if aa["passed"]:
        return None
    low, high = 1.0 - stats.AA_TOLERANCE, 1.0 + stats.AA_TOLERANCE
    if aa["q1"] > high or aa["q3"] < low:
        return "bias"
    return "noise" if aa["within_noise"] else "unexplained"


def reading(aa: dict) -> str:
    """The A/A row's verdict as the report prints it (failure)."""
    return {
        None: "yes",
        "bias": "NO: a bias, its quartiles all outside",
        "noise": f"NO: within this run's repeat noise ({aa['noise']:.3f}), too noisy to tell",
        "unexplained": "NO",
    }[failure(aa)]


def all_passed(results: dict) -> bool:
    return all(
        all(aa["passed"] for aa in result["aa"].values()) and result["order"]["passed"] for result in results.values()
    )


def verdict(results: dict) -> str:
    """The report's last line; where only A/A rows failed, each within its own noise, it says the machine was too
    noisy to tell, not that the harness is biased."""
    if all_passed(results):
        return "All checks passed."
    text = "Some checks failed: figures measured here now are not to be trusted."
    rows = [aa for result in results.values() for aa in result["aa"].values()]
    if all(result["order"]["passed"] for result in results.values()) and all(
        failure(aa) == "noise" for aa in rows if not aa["passed"]
    ):
        text += (
            " Each row that failed lies within its own run's repeat noise: this machine was too noisy for the check "
            "to tell a 3 % bias from none. Run it again on a quieter machine, or at a quieter time, before looking "
            "for a cause in the harness."
        )
    return text


def history(variant, rounds: Trials) -> None:
    """Measure a variant alone for a while (its samples then dropped): a base that ran a comparison before."""
    for _ in range(rounds.rounds):
        variant.trial(rounds.seconds)
    variant.samples.clear()


def aa_of(pair: isolated.Pair | Comparison) -> dict:
    """A crossed pair's A/A result: bench's and the ladder's (isolated.Pair) or tune's (its Comparison)."""
    return aa_result(pair.ratios, pair.aa_ratios, pair.process_factor, pair.samples)


def bench_pairing(cfg, rounds: Trials) -> dict:
    """Two fresh variants of one config, prepared one after the other, as bench prepares its variants."""
    with isolated.IsolatedVariant("A", cfg) as first, isolated.IsolatedVariant("A'", cfg) as second:
        return aa_of(isolated.pair_round(first, second, rounds.rounds, rounds.seconds))


def ladder_pairing(cfg, rounds: Trials) -> dict:
    """A base that ran a comparison before against a fresh candidate of the same config, as in the ladder."""
    with isolated.IsolatedVariant("base", cfg) as base:
        history(base, rounds)
        with isolated.IsolatedVariant("candidate", cfg) as candidate:
            return aa_of(isolated.pair_round(base, candidate, rounds.rounds, rounds.seconds))


def tune_pairing(load, rounds: Trials, own_value: dict) -> dict:
    """tune's own compare(): the best against a candidate that sets one knob to the value it already has
    (two variants, one config)."""
    measure = TrialMeasure(load, rounds.seconds)
    try:
        comparison = measure.compare({}, own_value, rounds.rounds)
    finally:
        measure.close()
    return aa_of(comparison)


def order(before_cfg, rung_cfg, rung: str, rounds: Trials) -> dict:
    """The rung's gain as the fresh candidate, then as the long-running base; do they agree?"""
    runs = {}
    for role, base_cfg, candidate_cfg in (("as_candidate", before_cfg, rung_cfg), ("as_base", rung_cfg, before_cfg)):
        print(f"  order, {rung} {role.replace('_', ' ')}:", flush=True)
        with isolated.IsolatedVariant("base", base_cfg) as base:
            history(base, rounds)
            with isolated.IsolatedVariant("candidate", candidate_cfg) as candidate:
                verdict = ladder.paired_round(base, candidate, rounds)
        gain = verdict.gain if role == "as_candidate" else stats.Gain.of([1 / r for r in verdict.gain.ratios])
        runs[role] = {**gain.as_dict(), "noise": verdict.noise}
    spread = max(stats.AA_TOLERANCE, runs["as_candidate"]["noise"], runs["as_base"]["noise"])
    first, second = runs["as_candidate"]["median"], runs["as_base"]["median"]
    return {
        "rung": rung,
        **runs,
        "difference": abs(first / second - 1.0),
        "spread": spread,
        "passed": stats.agree(first, second, spread),
    }


def order_configs(scenario, overrides: list[str]) -> tuple:
    """(config before the order-check rung, config with it, its name) from the scenario's ladder."""
    path = files.project_file(ladder.default_ladder(scenario))
    rungs = ladder.load_ladder(path)
    name = rungs.get("order_check") or rungs["rungs"][0]["name"]
    start, sets = path.parent / rungs["start"], list(overrides)
    for rung in rungs["rungs"]:
        if rung["name"] == name:
            before = scenario.load(start, sets, name="before")
            return before, scenario.load(start, sets + ladder.overrides(rung["set"]), name=name), name
        sets += ladder.overrides(rung["set"])
    raise AssertionError("load_ladder checks that order_check names a rung")


def check_scenario(choice: str, opts: CheckOptions) -> dict:
    scenario = scenario_lib.resolve(choice)
    optimized = scenario.load("configs/optimized.yaml", list(opts.overrides), name="optimized")
    before, rung_cfg, rung = order_configs(scenario, list(opts.overrides))
    trials.begin(scenario, [optimized, before])
    own = opts.trials
    config_path = files.project_file("configs/optimized.yaml")

    def load(state: dict, name: str = "tune"):
        return scenario.load(config_path, list(opts.overrides) + as_sets(state), name=name)

    started = time.monotonic()
    print("  A/A, bench's pairing:", flush=True)
    result = {"scenario": scenario.why, "aa": {"bench": bench_pairing(optimized, own or BenchOptions.TRIALS)}}
    print("  A/A, the ladder's pairing:", flush=True)
    result["aa"]["ladder"] = ladder_pairing(optimized, own or LadderOptions.TRIALS)
    print("  A/A, tune's pairing:", flush=True)
    shuffle = {"pipeline.shuffle_files": optimized.pipeline.shuffle_files}
    result["aa"]["tune"] = tune_pairing(load, own or TuneOptions.TRIALS, shuffle)
    result["order"] = order(before, rung_cfg, rung, own or LadderOptions.TRIALS)
    result["seconds"] = time.monotonic() - started
    return result


def table(results: dict) -> str:
    lines = [
        "| scenario | check | result | needs | passed |",
        "|---|---|---|---|:---:|",
    ]
    for name, result in results.items():
        for pairing, aa in result["aa"].items():
            lines.append(
                f"| {name} | A/A, {pairing}'s pairing | x{aa['median']:.3f} (quartiles {aa['q1']:.3f}-"
                f"{aa['q3']:.3f}; repeat noise {aa['noise']:.3f}; its processes x{aa['process_factor']:.3f} apart) | "
                f"1.00 +-{stats.AA_TOLERANCE:.0%} | {aa['reading']} |"
            )
        order_row = result["order"]
        lines.append(
            f"| {name} | order: {order_row['rung']} | as candidate x{order_row['as_candidate']['median']:.3f}, as base "
            f"x{order_row['as_base']['median']:.3f}: {order_row['difference']:.1%} apart | within "
            f"{order_row['spread']:.1%} (A/A spread) | {'yes' if order_row['passed'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(opts: CheckOptions) -> int:
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before, results = os.getloadavg(), {}
    for choice in opts.scenarios:
        print(f"[{choice}]", flush=True)
        results[choice] = check_scenario(choice, opts)
    passed = all_passed(results)
    load = {"before": list(load_before), "after": list(os.getloadavg())}
    cpu = machine.cpu_record()
    stalled = list(isolated.stalls)
    report = {
        "passed": passed,
        "load_average": load,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "stalls": stalled,
        "scenarios": results,
    }
    files.write_json(out / "check.json", report)
    before, after = (", ".join(f"{x:.2f}" for x in load[when]) for when in ("before", "after"))
    text = "\n".join(
        [
            "# bench-check",
            "",
            f"On {cpu['model']} ({'with' if cpu['bf16_units'] else 'without'} bfloat16 units), "
            f"{cpu['cores']} cores. Load average (1, 5, 15 min, as `uptime` prints it) before {before}, after "
            f"{after}.",
            "",
            table(results),
            "",
            (
                f"Workers stalled and were stopped and continued {len(stalled)} times ({'; '.join(stalled)}): "
                'see docs/benchmarks.md, "A worker that stalls".'
                if stalled
                else "No worker stalled."
            ),
            "",
            verdict(results),
            "",
        ]
    )
    files.write_text(out / "check.md", text)
    print()
    print(text)
    print(f"Written: {out}/check.json, {out}/check.md")
    return 0 if passed else 1
