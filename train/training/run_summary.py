"""summary.json: the figures of a finished run, in the one schema every loop writes and every
report reads; and what a finished run leaves behind (the model, each worker's fingerprint)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import keras
import numpy as np

from train.core import files
from train.training.run_setup import RunSetup


def summary(
    setup: RunSetup,
    model: keras.Model,
    history: dict,
    timing: dict,
    wall_s: float,
    warmup: int,
    utilization: dict | None = None,
    own: dict | None = None,
) -> dict:
    """The figures of a finished run: what ran (device, choices, data, model), how fast (`timing`,
    from measure/throughput.py), how well (history), the profile's and the sampler's view, and the
    workload's `own` figures (its meter's, under the workload's name: text runs' padding share is
    what the doctor reads)."""
    cfg, spec, choices, workload = setup.cfg, setup.spec, setup.choices, setup.workload
    figures = (
        _profile_figures(setup.run_dir)
        if cfg.profile.enabled and setup.task.is_chief
        else {"profile": None, "input_bound_percent": None, "device_busy_percent": None}
    )
    cpu = ((utilization or {}).get("cpu_utilization_percent") or {}).get("mean")
    return {
        "name": cfg.name,
        "run_dir": str(setup.run_dir),
        "config": setup.config_path,
        "device": setup.found.describe(),
        "device_kind": setup.found.kind,
        "choices": dataclasses.asdict(choices),
        "strategy": choices.strategy,
        "workers": setup.task.workers,
        "replicas": setup.replicas,
        "batch_size": workload.batch_size(cfg),
        "global_batch_size": setup.global_batch,
        "model": cfg.model.name,
        "model_params": cfg.model.params,
        "parameters": int(model.count_params()),
        "workload": workload.name,
        "unit": workload.unit.label,
        "dataset": workload.dataset_facts(spec),
        "pipeline": setup.describe_pipeline(),
        **({workload.name: own} if own is not None else {}),
        "epochs": cfg.train.epochs,
        "steps_per_epoch": setup.steps_per_epoch,
        "warmup_steps": warmup,
        "resumed_from": setup.resume["folder"] if setup.resume else None,
        "skipped_records": len(setup.skipped),
        "skipped_record_details": [str(problem) for problem in setup.skipped[:100]],
        **timing,
        "final_loss": _last(history, "loss"),
        "final_accuracy": _last(history, "accuracy"),
        "val_loss": _last(history, "val_loss"),
        "val_accuracy": _last(history, "val_accuracy"),
        "history": history,
        "wall_time_s": wall_s,
        "weights_sha256": weights_fingerprint(model),
        **figures,
        "utilization": utilization,
        "cpu_utilization_percent": cpu,
        "gpu_utilization_percent": (utilization or {}).get("gpu_utilization_percent"),
    }


def finish(setup: RunSetup, model: keras.Model, result: dict, log=print) -> dict:
    """Write what a finished run leaves: every worker its weight fingerprint, the chief the model and
    summary.json (last: a summary means the run is complete)."""
    if setup.task.kind != "local":
        files.write_json(
            setup.run_dir / "workers" / f"{setup.task.kind}-{setup.task.index}.json",
            {
                "task": f"{setup.task.kind}:{setup.task.index}",
                "weights_sha256": result["weights_sha256"],
                "epochs": result["epochs"],
                "steps_per_epoch": result["steps_per_epoch"],
                "final_loss": result["final_loss"],
            },
        )
    if not setup.task.is_chief:
        return result
    files.atomic_write(setup.run_dir / "model.keras", model.save)
    setup.workload.export(setup.cfg, setup.spec, model, setup.run_dir)
    files.write_json(setup.run_dir / "summary.json", result)
    rate, input_share = result["examples_per_sec"], result["input_bound_percent"]
    log(
        f"{setup.tag} done: "
        + (f"{rate:,.0f} examples/s, step {result['step_time_ms']:.1f} ms, " if rate else "")
        + setup.workload.describe_figures(result.get(setup.workload.name))
        + (f"{input_share:.1f}% of step time waiting for input, " if input_share is not None else "")
        + (f"val_accuracy {result['val_accuracy']:.3f}" if result["val_accuracy"] is not None else "")
        + f"  ->  {setup.run_dir}/summary.json"
    )
    return result


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 over every weight's bytes: equal weights, equal fingerprints (across workers, resumes)."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def _profile_figures(run_dir: Path) -> dict:
    """The profiler's view of the run: input-bound share, device busy share, slow stages."""
    from step_doctor.diagnose import analysis

    try:
        found = analysis.analyze_run(run_dir)
    except analysis.ProfileError as error:
        return {"profile": {"error": str(error)}, "input_bound_percent": None, "device_busy_percent": None}
    if found is None:
        return {"profile": None, "input_bound_percent": None, "device_busy_percent": None}
    return {
        "profile": found.to_json(),
        "input_bound_percent": found.input_bound_percent,
        "device_busy_percent": found.device_busy_percent,
    }


def _last(metrics: dict, key: str) -> float | None:
    values = metrics.get(key)
    return float(values[-1]) if values else None
