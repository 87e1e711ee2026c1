"""`python -m step_doctor_dev.bench_profile`: what `profile` costs a run outside its capture window.

One script of the diagnose corpus (tests/user_pipelines.py, plain tf.data + Keras) trains a fixed
number of steps, alone and under `step-doctor profile`, in interleaved trials (the order
alternates: without-with, with-without, ...), each a fresh process. The script times its own steps
(a plain Keras callback, the same in both), so the comparison needs nothing from profile: the
throughput over the steps after the warm-up and outside the capture window (the same steps are
left out of both), and the ratio with/without per pair of trials: its median and spread. The
default case, batches of 2, has the shortest steps of the corpus, where a per-step cost weighs most.

Throughput per trial is the batch over the median step time: what a step costs at steady state,
which a per-step cost of the capture would raise. The mean over all steps is reported too, but on
a shared machine it mostly measures the other processes (their bursts slowed whole trials by 2x
here while the median step moved by a few percent).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from step_doctor import files
from step_doctor.errors import UserError

# The diagnose corpus's scripts, in the doctor's tests: a checkout of the repository has them, a wheel does not.
SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "user_pipelines.py"
WARMUP_STEPS = 20  # tracing, autotuning and the capture window (5-16 by default) all fall before this


def _trial(with_profile: bool, case: str, data: Path, steps: int, work: Path, index: int) -> dict:
    times = work / f"times-{index}-{'with' if with_profile else 'without'}.json"
    script = [sys.executable, str(SCRIPT), case, str(data), "--steps", str(steps)]
    script += ["--times", str(times)]
    if with_profile:
        logdir = work / f"profile-{index}"
        command = [sys.executable, "-m", "step_doctor", "profile", "--json", "--logdir", str(logdir), "--", *script]
    else:
        command = script
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not times.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise UserError(f"A bench-profile trial failed (status {done.returncode}): {' | '.join(tail)}")
    recorded = json.loads(times.read_text())
    window = None
    if with_profile:
        document = json.loads(done.stdout)
        for process in document["capture"]["processes"]:
            if (process.get("window") or {}).get("steps"):
                first, last = process["window"]["steps"]
                window = (first, (process.get("capture") or {}).get("last_step", last))
    wall = time.time() - started
    return {"ends": recorded["step_ends"], "batch": recorded["batch"], "window": window, "wall_s": wall}


def _rates(trial: dict, skip: set[int]) -> tuple[float, float]:
    """(examples/s at the median step time, examples/s over all steps) after the warm-up, leaving out `skip`."""
    ends = trial["ends"]
    kept = [
        ends[i] - ends[i - 1]
        for i in range(max(1, WARMUP_STEPS), len(ends))
        if i not in skip and i - 1 not in skip  # a step's time is measured from the previous step's end
    ]
    if not kept:
        raise UserError(f"bench-profile: no step after the {WARMUP_STEPS}-step warm-up: raise --steps.")
    return trial["batch"] / statistics.median(kept), trial["batch"] * len(kept) / sum(kept)


def measure(case: str, trials: int, steps: int) -> dict:
    if not SCRIPT.is_file():
        raise UserError(
            f"bench-profile runs the scripts of the diagnose corpus ({SCRIPT}), which come with a checkout of the "
            "repository, not with an installed step-doctor: run it from a checkout (make bench-profile)."
        )
    if steps < 2 * WARMUP_STEPS:
        raise UserError(f"--steps {steps}: give at least {2 * WARMUP_STEPS} (the first {WARMUP_STEPS} are warm-up).")
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as folder:
        work = Path(folder)
        data = work / "files"
        subprocess.run([sys.executable, str(SCRIPT), "--make-files", str(data)], check=True, timeout=300)
        pairs = []
        for index in range(trials):
            order = (False, True) if index % 2 == 0 else (True, False)
            done = {flag: _trial(flag, case, data, steps, work, index) for flag in order}
            window = done[True]["window"]
            skip = set(range(window[0], window[1] + 2)) if window else set()
            (without, without_mean), (with_, with_mean) = (_rates(done[flag], skip) for flag in (False, True))
            pairs.append(
                {
                    "without": without,
                    "with": with_,
                    "ratio": with_ / without,
                    "without_mean": without_mean,
                    "with_mean": with_mean,
                    "ratio_mean": with_mean / without_mean,
                }
            )
            print(
                f"pair {index + 1}/{trials}: without {without:,.0f} ex/s, with profile {with_:,.0f} ex/s, ratio "
                f"{with_ / without:.3f} (means over all steps: {without_mean:,.0f}, {with_mean:,.0f}, "
                f"{with_mean / without_mean:.3f})",
                flush=True,
            )
    return _summary(case, steps, pairs)


def _summary(case: str, steps: int, pairs: list[dict]) -> dict:
    def spread(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values), "samples": values}

    return {
        "case": case,
        "script": SCRIPT,
        "steps_per_trial": steps,
        "warmup_steps": WARMUP_STEPS,
        "trials": len(pairs),
        "throughput": "batch / median step time, per trial",
        "without_examples_per_sec": spread([p["without"] for p in pairs]),
        "with_examples_per_sec": spread([p["with"] for p in pairs]),
        "ratio": spread([p["ratio"] for p in pairs]),
        "mean_over_all_steps": {
            "without_examples_per_sec": spread([p["without_mean"] for p in pairs]),
            "with_examples_per_sec": spread([p["with_mean"] for p in pairs]),
            "ratio": spread([p["ratio_mean"] for p in pairs]),
        },
        "required_ratio": 0.97,
    }


def main(args) -> int:
    if args.trials < 1:
        raise UserError("--trials must be at least 1.")
    out = Path(args.out)
    result = measure(args.case, args.trials, args.steps)
    ratio = result["ratio"]
    without, with_ = result["without_examples_per_sec"], result["with_examples_per_sec"]
    means = result["mean_over_all_steps"]["ratio"]
    print(
        f"{args.case}, {args.steps} steps per trial, {args.trials} interleaved pairs, steps after the "
        f"{WARMUP_STEPS}-step warm-up and outside the capture window, batch / median step time:\n"
        f"  without profile: {without['median']:,.0f} ex/s (min-max {without['min']:,.0f}-{without['max']:,.0f})\n"
        f"  with profile:    {with_['median']:,.0f} ex/s (min-max {with_['min']:,.0f}-{with_['max']:,.0f})\n"
        f"  with / without:  median {ratio['median']:.3f} (per pair {ratio['min']:.3f}-{ratio['max']:.3f}); "
        f"required >= {result['required_ratio']}: {'yes' if ratio['median'] >= result['required_ratio'] else 'NO'}\n"
        f"  (the means over all steps: with / without median {means['median']:.3f}, per pair {means['min']:.3f}-"
        f"{means['max']:.3f}: mostly the other processes of this machine)"
    )
    files.write_json(out / "bench-profile.json", result)
    print(f"wrote {out / 'bench-profile.json'}")
    return 0


def parser() -> argparse.ArgumentParser:
    bench = argparse.ArgumentParser(
        prog="python -m step_doctor_dev.bench_profile",
        description="What `step-doctor profile` costs: a corpus script with and without it, interleaved trials.",
    )
    bench.add_argument("--trials", type=int, default=7, help="pairs of trials, with and without (default: %(default)s)")
    bench.add_argument("--case", default="tiny_batch", help="the corpus case (default: %(default)s)")
    bench.add_argument("--steps", type=int, default=3000, help="training steps per trial (default: %(default)s)")
    bench.add_argument("--out", default="runs/bench-profile", help="output folder (default: %(default)s)")
    bench.add_argument(
        "--multi-worker",
        type=int,
        metavar="N",
        help="instead: run the two-worker corpus script N times under profile and N times alone, and count the "
        "runs in which a worker died",
    )
    bench.set_defaults(func=_main)
    return bench


def _main(args) -> int:
    if args.multi_worker is not None:
        from step_doctor_dev import survival

        return survival.main(args)
    return main(args)


if __name__ == "__main__":
    from step_doctor.cli import run

    sys.exit(run(parser().parse_args()))
