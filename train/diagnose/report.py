"""Diagnose any TensorBoard log folder that holds a profile: verdict, figures, what to do.

Works on profiles written by this project and by others: a bare `tf.profiler` log folder,
or a TensorBoard log folder with several runs. It reads only the profile (xprof's offline
converter, no TensorFlow import), never the code or a config, to name the cause:

- Steps come from step markers, else are inferred from the host trace (the stock Keras
  TensorBoard callback's "Profiled batch" events, or the executions of the train function);
  inferred figures are labelled so, with how to add markers.
- The verdict: 20 % or more of step time waiting for input is input-bound (xprof's own
  threshold). Otherwise the step is device-bound when the accelerator (or, in a CPU-only
  profile, the CPU) computes most of it, host-bound when per-step overhead does.
- Recommendations name the cause the profile shows (train/diagnose/causes.py for the input
  pipeline, the device and host causes below), each with this profile's figures, the step
  time its fix removes and the estimated gain. A cause that changes what is learned ranks
  first, then the most step time removed.

Exit status of `main` (the CLI's): 0; 3 when --fail-if-input-bound finds a run above its
threshold; 4 when a run could not be measured (unreadable profile, or no input share) and
the gate was asked for, or when a profile is unreadable, unless --allow-unmeasured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from train.core.errors import UserError
from train.diagnose import analysis, causes

UNMEASURED = 4

HOW_TO_CAPTURE = (
    "Step markers give exact steps: `from train.measure.profiling import StepTraceProfiler` and pass "
    "`callbacks=[StepTraceProfiler(logdir, start_step=10, num_steps=10)]` to model.fit (it wraps each step in "
    "tf.profiler.experimental.Trace('train', step_num=step, _r=1), around fetching the batch and running it). "
    "The stock Keras TensorBoard(profile_batch=...) callback writes no step marker (openxla/xprof#578), so xprof "
    "itself shows no step time for it."
)
CPU_ONLY_NOTE = (
    "CPU-only profile: the input pipeline and the model share the same cores, so a stage that looks slow may be "
    "starved by the model, and overlap (prefetch, parallel calls) gains less here than on a GPU host; estimates "
    "assume the cores a fix needs are free."
)


def _run_config(session: Path) -> dict:
    """The run's config.yaml (this template's runs have one), or {} for foreign logs; used for precision only."""
    run_dir = session.parent.parent.parent
    for candidate in (run_dir / "config.yaml", run_dir.parent / "config.yaml"):
        if candidate.is_file():
            try:
                values = yaml.safe_load(candidate.read_text())
                return values if isinstance(values, dict) else {}
            except yaml.YAMLError:
                return {}
    return {}


def _get(config: dict, section: str, key: str):
    value = config.get(section)
    return value.get(key) if isinstance(value, dict) else None


def verdict(profile: dict) -> str:
    share = profile["input_bound_percent"]
    if share is None or not profile["step_time_ms"]:
        return "unknown"
    if share >= analysis.INPUT_BOUND_HIGH:
        return "input-bound"
    if profile["device_busy_percent"] is None:  # CPU-only: the CPU is the compute device
        wait = profile.get("input_pipeline") or {}
        overhead = wait.get("overhead_ms") or 0.0
        return "host-bound" if overhead >= 0.5 * profile["step_time_ms"] else "device-bound"
    return "device-bound" if profile["device_busy_percent"] >= 50 else "host-bound"


def _device_causes(profile: dict, config: dict) -> list[dict]:
    """Causes from xprof's step breakdown: launches, compilation, copies, placement, device use, precision."""
    step = profile["step_time_ms"]
    if not profile["has_step_markers"] or not step:
        return []
    share = {key: 100 * profile[key] / step for key in analysis.STEP_FIELDS if key != "step_time_ms"}
    has_device = profile["device_busy_percent"] is not None
    input_share = profile["input_bound_percent"] or 0.0
    found = []

    def add(cause, title, removes_ms, evidence, fix, caveat=None):
        found.append(
            {
                "cause": cause,
                "title": title,
                "kind": "speed",
                "score": round(100 * removes_ms / step, 1),
                "removes_ms": round(removes_ms, 3),
                "estimated_gain": causes._gain(step, removes_ms),
                "evidence": evidence,
                "fix": fix,
                "caveat": caveat,
            }
        )

    if share["kernel_launch_ms"] >= 10:
        add(
            "small-kernels",
            "Too many small kernels",
            profile["kernel_launch_ms"] / 2,
            f"{share['kernel_launch_ms']:.1f}% of step time ({profile['kernel_launch_ms']:.1f} ms) launches kernels",
            "Compile the step with XLA: `model.compile(..., jit_compile=True)` fuses kernels; run several steps per "
            "call: `steps_per_execution=16`. In this template: train.jit_compile: true, train.steps_per_execution.",
            "Estimate: half the launch time; XLA's gain depends on the model and the device.",
        )
    if share["compile_ms"] >= 5:
        add(
            "recompilation",
            "The step is compiled again and again",
            profile["compile_ms"],
            f"{share['compile_ms']:.1f}% of step time ({profile['compile_ms']:.1f} ms) compiles",
            "Keep shapes static so the step is traced once: `.batch(256, drop_remainder=True)`, pad variable-length "
            "inputs to a few fixed sizes. In this template: pipeline.drop_remainder: true.",
        )
    copies = profile["device_to_device_ms"] + profile["output_ms"]
    if 100 * copies / step >= 10:
        add(
            "device-copies",
            "Copies between devices or to the host",
            copies / 2,
            f"{100 * copies / step:.1f}% of step time ({copies:.1f} ms) copies between devices or to the host",
            "Keep tensors on the device; ship uint8 images and convert them on the device. In this template the "
            "models do (train/models.py).",
            "Estimate: half the copy time.",
        )
    if has_device:
        busy = profile["device_busy_percent"]
        if share["host_compute_ms"] >= 20:
            add(
                "host-placement",
                "Work placed on the host",
                profile["host_compute_ms"] / 2,
                f"{share['host_compute_ms']:.1f}% of step time is host compute while a device is present",
                "Check op placement (`tf.debugging.set_log_device_placement(True)`); move preprocessing into tf.data "
                "or onto the device.",
                "Estimate: half the host compute.",
            )
        if busy < 50 and input_share < analysis.INPUT_BOUND_HIGH:
            add(
                "model-too-small",
                "Model too small for the device",
                0.0,
                f"the device computes only {busy:.1f}% of each step and input is not the cause",
                "Give each step more work: `.batch(256)`, `steps_per_execution=16`, XLA; or a larger model.",
            )
        precision = _get(config, "train", "precision")
        if busy >= 50 and precision in (None, "float32"):
            add(
                "float32",
                "float32 where mixed precision would serve",
                profile["device_compute_ms"] / 3,
                f"the device computes {busy:.1f}% of each step" + (" in float32" if precision == "float32" else ""),
                "`keras.mixed_precision.set_global_policy('mixed_float16')` on tensor-core GPUs. In this template: "
                "train.precision: auto.",
                "Estimate: a third of device compute; tensor cores gain 2-3x on matmuls and convolutions, less "
                "elsewhere.",
            )
    return found


def recommendations(profile: dict, config: dict | None = None) -> list[dict]:
    """The causes this profile shows, ranked: what changes what is learned first, then most step time removed."""
    if profile["input_bound_percent"] is None or not profile["step_time_ms"]:
        return []
    cpu_only = profile["device_busy_percent"] is None
    found = causes.input_causes(profile.get("input_pipeline") or {}, cpu_only) + _device_causes(profile, config or {})
    kept = [r for r in found if r["kind"] == "correctness" or r["estimated_gain"] >= causes.MIN_GAIN]
    kept.sort(key=lambda r: (r["kind"] != "correctness", -r["removes_ms"]))
    return kept


def _no_profile_message(logdir: Path) -> str:
    strays = []
    for folder in sorted(logdir.rglob("plugins/profile/*")):
        if folder.is_dir():
            names = sorted(p.name for p in folder.iterdir())[:4]
            strays.append(f"{folder} ({', '.join(names) or 'empty'})")
    found = (
        f" Found profile folders without one: {'; '.join(strays[:3])}: xprof 2.24 reads only .xplane.pb files."
        if strays
        else ""
    )
    return f"No TensorBoard profile under '{logdir}' (no plugins/profile/*/*.xplane.pb).{found} " + HOW_TO_CAPTURE


def diagnose(logdir: str | Path) -> dict:
    logdir = Path(logdir)
    if not logdir.exists():
        raise UserError(f"Log folder '{logdir}' does not exist. Pass a TensorBoard log folder, e.g. runs/compare.")
    sessions = analysis.find_profile_sessions(logdir)
    if not sessions:
        raise UserError(_no_profile_message(logdir))
    runs = {}
    for run, session in sessions.items():
        try:
            profile = analysis.analyze_session(session)
        except analysis.ProfileError as error:
            runs[run] = {"verdict": "unreadable", "error": str(error), "recommendations": []}
            continue
        wait = profile["input_pipeline"]
        runs[run] = {
            "verdict": verdict(profile),
            "steps_inferred": profile["steps_inferred"],
            "profile": profile,
            "recommendations": recommendations(profile, _run_config(session)),
            "how_to_capture": None if profile["has_step_markers"] else HOW_TO_CAPTURE,
            "unmeasured": None if profile["input_bound_percent"] is not None else wait.get("reason"),
            "notes": _notes(profile),
        }
    return {"logdir": str(logdir), "runs": runs}


def _notes(profile: dict) -> list[str]:
    wait = profile["input_pipeline"]
    if not wait.get("measured"):
        return []
    notes = [CPU_ONLY_NOTE] if profile["device_busy_percent"] is None else []
    lost, input_ms = wait.get("unattributed_ms") or 0.0, wait["input_ms"] or 0.0
    if input_ms >= 0.1 * wait["step_ms"] and lost >= 0.25 * input_ms:
        held = max((s for s in wait["stages"] if s["pass_through"]), key=lambda s: s["blocking_ms"])
        notes.append(
            f"Unseen producers: {lost:.1f} ms of the {input_ms:.1f} ms input wait per step "
            f"({100 * lost / input_ms:.0f} %) waits on {held['path']}, whose producer threads left no events in this "
            "profile, so the causes above miss that share. TensorFlow 2.17's profiler drops the events of threads "
            "that ended before the capture stopped (each epoch's iterator threads end with its epoch); 2.21 keeps "
            "them. Profile steps within one epoch, or `.repeat()` the dataset and pass steps_per_epoch, to see them."
        )
    return notes


def _summary(run: str, item: dict) -> str:
    if item["verdict"] == "unreadable":
        return f"{run}: UNREADABLE profile (see below)"
    profile = item["profile"]
    if profile["input_bound_percent"] is None:
        return f"{run}: verdict unknown ({item['unmeasured'] or 'no input share'})"
    how = "inferred steps" if item["steps_inferred"] else "step markers"
    first = item["recommendations"][0] if item["recommendations"] else None
    fix = f"; first: {first['cause']} ({first['estimated_gain']:.2f}x)" if first else "; nothing to fix"
    share = profile["input_bound_percent"]
    step = (profile["input_pipeline"] or {}).get("step_ms") or profile["step_time_ms"]
    return f"{run}: {item['verdict'].upper()}, {share:.1f}% of a {step:.1f} ms step waits for input ({how}){fix}"


def _tree(wait: dict) -> list[str]:
    lines = []
    for s in wait.get("stages", []):
        depth = s["path"].count("::") - 1
        notes = []
        if s["injected"]:
            notes.append("injected by tf.data")
        for key in ("parallelism", "batch_size", "buffer_limit", "buffer_size"):
            if key in s["params"]:
                notes.append(f"{key} {s['params'][key]}")
        if s["functions"]:
            notes.append(
                f"fn {s['functions']['work_ms']:.1f} ms/step, {s['functions']['concurrency'] or 0:.1f} at a time"
            )
        if s["blocking_ms"] + s["fill_ms"] >= 0.01 * wait["step_ms"]:
            notes.append(f"holds the step {s['blocking_ms'] + s['fill_ms']:.1f} ms/step")
        lines.append("    " + "  " * max(depth, 0) + s["kind"] + (f"  [{'; '.join(notes)}]" if notes else ""))
    return lines


def render(result: dict) -> str:
    lines = [_summary(run, item) for run, item in result["runs"].items()]
    for run, item in result["runs"].items():
        lines.append("")
        lines.append(f"== {run} ==")
        if item["verdict"] == "unreadable":
            lines.append(f"  {item['error']}")
            continue
        profile = item["profile"]
        wait = profile["input_pipeline"]
        lines.append(f"  profile: {profile['session']} ({profile['hardware_type']}, {profile['steps']} steps)")
        source = profile["step_source"] or "none found"
        per_window = (wait.get("steps_per_window") or 1) if wait.get("measured") else 1
        if per_window > 1:
            source += f", each {per_window} training steps (steps_per_execution): figures are per execution"
        lines.append(f"  steps: {source}" + (" (INFERRED: no step markers)" if item["steps_inferred"] else ""))
        if profile["input_bound_percent"] is None:
            lines.append(f"  verdict: unknown - {item['unmeasured'] or 'the input share could not be measured'}.")
            lines.append(f"  {HOW_TO_CAPTURE}")
            continue
        label = " (inferred steps)" if item["steps_inferred"] else ""
        lines.append(f"  verdict: {item['verdict'].upper()}{label}")
        device = profile["device_busy_percent"]
        lines.append(
            f"  step {profile['step_time_ms']:.1f} ms = input {profile['input_ms']:.1f} + host compute "
            f"{profile['host_compute_ms']:.1f} + device compute {profile['device_compute_ms']:.1f} + launch "
            f"{profile['kernel_launch_ms']:.1f} + other {profile['other_ms']:.1f} ms"
        )
        lines.append(
            f"  waiting for input: {profile['input_bound_percent']:.1f}% of step time; device busy: "
            + (f"{device:.1f}%" if device is not None else "n/a (CPU-only profile)")
        )
        if wait.get("measured"):
            batch = wait.get("batch_size")
            prefetch = wait["prefetch"]
            if prefetch:
                kinds = ", ".join("injected by tf.data" if p["injected"] else "yours" for p in prefetch)
                prefetch_text = f"yes ({kinds})"
            else:
                prefetch_text = "none"
            lines.append(
                f"  batch: {batch if batch else 'unknown'}; prefetch: {prefetch_text}; tf.data cores: "
                f"{wait.get('cpu_budget') or 'unknown'}; the tf.data pipeline as it ran:"
            )
            lines.extend(_tree(wait))
        if profile["has_step_markers"] and profile["conclusion"]:
            lines.append(f"  xprof: {profile['conclusion']}")
        for rank, rec in enumerate(item["recommendations"], start=1):
            gain = "" if rec["kind"] == "correctness" else f", estimated gain {rec['estimated_gain']:.2f}x"
            lines.append(f"  {rank}. {rec['title']} [{rec['cause']}{gain}]")
            lines.append(f"     evidence: {rec['evidence']}.")
            lines.append(f"     fix: {rec['fix']}")
            if rec.get("caveat"):
                lines.append(f"     note: {rec['caveat']}")
        if not item["recommendations"]:
            lines.append("  nothing to fix: no known cause would gain 5% or more in this profile.")
        for note in item["notes"]:
            lines.append(f"  {note}")
        if item["how_to_capture"]:
            lines.append(f"  {item['how_to_capture']}")
    return "\n".join(lines)


def main(
    logdir: str,
    as_json: bool = False,
    fail_if_input_bound: float | None = None,
    allow_unmeasured: bool = False,
) -> int:
    result = diagnose(logdir)
    print(json.dumps(result, indent=2) if as_json else render(result))
    unmeasured = [
        (run, "unreadable profile" if item["verdict"] == "unreadable" else (item["unmeasured"] or "no input share"))
        for run, item in result["runs"].items()
        if item["verdict"] == "unreadable" or item["profile"]["input_bound_percent"] is None
    ]
    status = 0
    if fail_if_input_bound is not None:
        over = [
            (run, item["profile"]["input_bound_percent"])
            for run, item in result["runs"].items()
            if item.get("profile") and (item["profile"]["input_bound_percent"] or 0.0) > fail_if_input_bound
        ]
        if over:
            names = ", ".join(f"{run} ({share:.1f}%)" for run, share in over)
            print(f"FAIL: input-bound above {fail_if_input_bound}% of step time: {names}", file=sys.stderr)
            status = 3
    gate = fail_if_input_bound is not None
    blocking = [(run, why) for run, why in unmeasured if gate or why == "unreadable profile"]
    if blocking and not allow_unmeasured:
        names = "; ".join(f"{run}: {why}" for run, why in blocking)
        print(
            f"FAIL: could not measure the input share of {names}. The gate passes only what it measured; "
            "--allow-unmeasured lets such runs through.",
            file=sys.stderr,
        )
        status = status or UNMEASURED
    return status
