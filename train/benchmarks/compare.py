"""`make compare`: naive and optimized on the same data, model and device, then the report.

Each run trains in its own process (a fresh TensorFlow, so neither inherits the other's
threads or caches) into runs/compare/<name>/; the report is built only from what the
runs wrote. On a machine without a GPU the workload's CPU scenario (images: configs/scenarios/cpu.yaml,
a tiny model, so the input pipeline is the bottleneck as on an accelerator) is applied.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from step_doctor.tensorboard import text_summary
from train import scenario as scenario_lib
from train import workloads
from train.benchmarks import report, trials
from train.benchmarks.options import CompareOptions
from train.core.errors import RunFailed, Stopped, UserError
from train.workloads.base import get


def fit_in_subprocess(config_path: str, overlays: list[str], overrides: list[str]) -> None:
    command = [sys.executable, "-m", "train", "fit", "--config", config_path]
    command += [arg for path in overlays for arg in ("--overlay", path)]
    command += [arg for item in overrides for arg in ("--set", item)]
    print("$ " + " ".join(command[1:]), flush=True)
    process = subprocess.Popen(command)
    # A SIGTERM for compare (docker compose stop, preemption) goes to the run in progress, which
    # saves a checkpoint and stops; Ctrl-C reaches it anyway (same process group).
    previous = signal.signal(signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))
    try:
        code = process.wait()
    except KeyboardInterrupt:
        code = process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code in (128 + signal.SIGTERM, 128 + signal.SIGINT):
        raise Stopped(
            f"compare stopped during {config_path}; its checkpoint is kept: rerun the same command to "
            "resume it (finished runs are trained again).",
            code,
        )
    if code == 0:
        return
    message = (
        f"Training {config_path} failed (exit {code}); its output is above. "
        f"Rerun it alone with: python {' '.join(command[1:])}"
    )
    # A config the run refused (exit 2) stays a config error; anything else (a run that failed, exit 3:
    # a stall, a lost peer; or a crash) is a failed run, exit 3, so scripts can tell the two apart.
    raise UserError(message) if code == 2 else RunFailed(message)


def main(opts: CompareOptions) -> int:
    scenario = scenario_lib.for_preset(opts.variants.scenario, opts.variants.naive)
    out = Path(opts.out)
    presets = {"naive": opts.variants.naive, "optimized": opts.variants.optimized}
    overrides = list(opts.variants.overrides) + [f"runs_dir={out}"]
    configs = {name: scenario.load(path, overrides, name=name) for name, path in presets.items()}
    naive, optimized = configs["naive"], configs["optimized"]
    workload = workloads.get(naive.workload)
    same_data = naive.workload == optimized.workload and get(naive, workload.data_key) == get(
        optimized, workload.data_key
    )
    if not same_data or naive.model != optimized.model:
        what = "workload" if naive.workload != optimized.workload else workload.data_key if not same_data else "model"
        raise UserError(
            f"{opts.variants.naive} and {opts.variants.optimized} must train the same data and model to be compared; "
            f"they differ in {what}. Put workload, data and model in the shared base preset ({workload.presets.base})."
        )
    trials.begin(scenario, [optimized])

    summaries = {}
    for name, path in presets.items():
        fit_in_subprocess(path, scenario.overlays, overrides + [f"name={name}"])
        summaries[name] = json.loads((out / name / "summary.json").read_text())
    result = report.build(summaries, scenario=scenario.why)
    report.write(out, result)
    text_summary.write_comparison(out, result)  # the verdicts in TensorBoard's Text tab (the doctor's)
    print()
    print(scenario.why + ".")
    print(report.table(result))
    print(
        f"\nReport: {out}/report.md, {out}/report.png, {out}/report.json. "
        f"Profiles: make tensorboard (Profile tab), or make diagnose LOGDIR={out}"
    )
    return 0
