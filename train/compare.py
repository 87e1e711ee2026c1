"""`make compare`: naive and optimized on the same data, model and device, then the report.

Each run trains in its own process (a fresh TensorFlow, so neither inherits the other's
threads or caches) into runs/compare/<name>/; the report is built only from what the
runs wrote. On a machine without a GPU the CPU scenario (configs/scenarios/cpu.yaml: a
tiny model, so the input pipeline is the bottleneck as on an accelerator) is applied.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from train import config as config_lib
from train import datasets, report
from train.errors import UserError

CPU_SCENARIO = "configs/scenarios/cpu.yaml"


def has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def resolve_scenario(choice: str) -> tuple[str | None, str]:
    """(overlay path or None, a sentence saying why)."""
    if choice == "none":
        return None, "no scenario overlay: both presets as written"
    if choice != "auto":
        if not Path(choice).is_file():
            raise UserError(f"--scenario '{choice}' is not a file. Use auto, none, or a YAML overlay such as "
                            f"{CPU_SCENARIO}.")
        return choice, f"scenario overlay {choice}"
    if has_gpu():
        return None, "GPU found: both presets as written"
    return CPU_SCENARIO, (
        f"No GPU found: running the CPU scenario that mirrors a fast GPU ({CPU_SCENARIO}: a tiny model, so the "
        "input pipeline, not the model, limits throughput, as it does on an accelerator)"
    )


def fit_in_subprocess(config_path: str, overlays: list[str], overrides: list[str]) -> None:
    command = [sys.executable, "-m", "train", "fit", "--config", config_path]
    command += [arg for path in overlays for arg in ("--overlay", path)]
    command += [arg for item in overrides for arg in ("--set", item)]
    print("$ " + " ".join(command[1:]), flush=True)
    result = subprocess.run(command)
    if result.returncode != 0:
        raise UserError(f"Training {config_path} failed (exit {result.returncode}); its output is above. "
                        f"Rerun it alone with: python {' '.join(command[1:])}")


def main(args) -> int:
    scenario, why = resolve_scenario(args.scenario)
    overlays = [scenario] if scenario else []
    out = Path(args.out)
    presets = {"naive": args.naive, "optimized": args.optimized}
    overrides = list(args.overrides) + [f"runs_dir={out}"]
    configs = {name: config_lib.load(path, overrides + [f"name={name}"], layers=overlays)
               for name, path in presets.items()}
    naive, optimized = configs["naive"], configs["optimized"]
    if naive.data != optimized.data or naive.model != optimized.model:
        raise UserError(f"{args.naive} and {args.optimized} must train the same data and model to be compared; "
                        f"they differ in {'data' if naive.data != optimized.data else 'model'}. "
                        "Put data and model in the shared base preset (configs/base.yaml).")
    print(why + ".", flush=True)
    spec, built = datasets.prepare(optimized.data)
    if built:
        print(f"Built the dataset at {spec.root}.", flush=True)

    summaries = {}
    for name, path in presets.items():
        fit_in_subprocess(path, overlays, overrides + [f"name={name}"])
        summaries[name] = json.loads((out / name / "summary.json").read_text())
    result = report.build(summaries, scenario=why)
    report.write(out, result)
    print()
    print(why + ".")
    print(report.table(result))
    print(f"\nReport: {out}/report.md, {out}/report.png, {out}/report.json. "
          f"Profiles: make tensorboard (Profile tab), or make diagnose LOGDIR={out}")
    return 0
