"""Diagnose any TensorBoard log folder that holds a profile: verdict, figures, what to do.

Works on profiles written by this project and by others (it reads only what xprof reads).
The verdict follows xprof's own thresholds: 20 % or more of step time waiting for input is
input-bound. Otherwise the step is device-bound when the accelerator computes most of it,
and host-bound (Python, kernel launches, host ops) when it does not. Recommendations are
drawn from the known causes of low GPU utilization, ranked by the share of step time each
one explains, and name the knob of this template that addresses it.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from train.errors import UserError
from train.measure import analysis

HOW_TO_CAPTURE = (
    "Capture a profile with step markers: in this template every `python -m train fit` does it "
    "(profile.enabled). In your own Keras code wrap each step in "
    "tf.profiler.experimental.Trace('train', step_num=step, _r=1), opened in on_train_batch_begin and "
    "closed in on_train_batch_end (see train/measure/profiling.py), between tf.profiler.experimental.start(logdir) "
    "and stop(). The stock Keras 3 TensorBoard(profile_batch=...) callback writes no step marker "
    "(openxla/xprof#578)."
)

# The tf.data stage that takes the most time -> what to change (and the knob that does it here).
STAGE_ADVICE = [
    (
        ("Generator", "PyFunc", "FlatMap"),
        "Python code produces the examples one at a time: read TFRecord shards with tf.data "
        "(interleave + map with num_parallel_calls=AUTOTUNE) instead of from_generator "
        "(pipeline.reader: tfrecord).",
    ),
    (
        ("ParallelMap",),
        "Decoding/augmenting is the slowest stage even in parallel: cache decoded examples "
        "(pipeline.cache), augment whole batches with vectorized ops (pipeline.augment: batched), "
        "or move the work offline or to tf.data service workers (pipeline.data_service).",
    ),
    (
        ("Map", "MapAndBatch"),
        "A map (decode/augment) is the slowest stage: give it num_parallel_calls=tf.data.AUTOTUNE "
        "(pipeline.parallel_calls: auto); if it is already parallel, cache decoded examples (pipeline.cache) "
        "and augment whole batches with vectorized ops (pipeline.augment: batched).",
    ),
    (
        ("TFRecord", "FixedLengthRecord", "TextLine", "Interleave", "ParallelInterleave"),
        "Reading files is the slowest stage: read shards in parallel with interleave "
        "(pipeline.parallel_reads), use more shards of 100-200 MB, keep data on local disk, cache after decode.",
    ),
    (("Shuffle",), "The shuffle buffer is slow to refill: shuffle the file order and use a smaller element buffer."),
    (
        ("Batch", "ParallelBatch", "Padded"),
        "Batching is expensive: batch before per-element work and vectorize that work after batch.",
    ),
]


def _stage_advice(stage: str) -> str:
    for names, advice in STAGE_ADVICE:
        if any(stage.startswith(name) for name in names):
            return advice
    return "Profile that stage on its own (tf.data.experimental.benchmark) and parallelize, cache or move it."


def _run_config(session: Path) -> dict:
    """The run's config.yaml (this template's runs have one), or {} for foreign logs."""
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
    if not profile["has_step_markers"]:
        return "unknown"
    if profile["input_bound_percent"] >= analysis.INPUT_BOUND_HIGH:
        return "input-bound"
    if profile["device_busy_percent"] is None:  # CPU-only profile: the CPU is the compute device
        return "device-bound"
    return "device-bound" if profile["device_busy_percent"] >= 50 else "host-bound"


def recommendations(profile: dict, config: dict) -> list[dict]:
    """Known causes that this profile shows, most step time explained first."""
    step = profile["step_time_ms"]
    if not profile["has_step_markers"] or not step:
        return []
    share = {key: 100 * profile[key] / step for key in analysis.STEP_FIELDS if key != "step_time_ms"}
    has_device = profile["device_busy_percent"] is not None
    found = []

    def add(score: float, cause: str, evidence: str, fix: str) -> None:
        found.append({"cause": cause, "score": round(score, 1), "evidence": evidence, "fix": fix})

    input_share = profile["input_bound_percent"]
    if input_share >= analysis.INPUT_BOUND_MODERATE:
        stages = profile["slow_stages"]
        if stages:
            top = stages[0]
            evidence = (
                f"{input_share:.1f}% of step time waits for input; the slowest tf.data stage is "
                f"{top['stage']} ({top['self_time_percent']:.0f}% of input-pipeline time: {top['name']})"
            )
            fix = _stage_advice(top["stage"])
        else:
            evidence = f"{input_share:.1f}% of step time waits for input"
            fix = (
                "Host-to-device copies or an input pipeline outside tf.data: feed a tf.data pipeline, ship "
                "compact uint8 batches, prefetch (pipeline.prefetch: auto)."
            )
        add(input_share, "slow input pipeline", evidence, fix)
        if (
            stages
            and not any("Prefetch" in s["name"] for s in stages)
            and _get(config, "pipeline", "prefetch") in (0, None)
        ):
            add(
                input_share / 2,
                "no prefetch",
                "no Prefetch stage among the busiest tf.data iterators",
                "End the pipeline with .prefetch(tf.data.AUTOTUNE) so the next batch is prepared during the step "
                "(pipeline.prefetch: auto).",
            )

    batch = _get(config, "pipeline", "batch_size")
    if isinstance(batch, int) and batch < 64:
        add(
            max(10.0, input_share / 3),
            "batch too small",
            f"batch size {batch}: fixed per-step costs (Python, launches, input) are paid every {batch} examples",
            "Raise the batch size (pipeline.batch_size, `make sweep-batch` finds the largest that fits) and scale "
            "the learning rate with it.",
        )
    elif step < 5 and not has_device:
        add(
            10.0,
            "steps too short",
            f"a step takes {step:.2f} ms: per-step overhead dominates",
            "Raise the batch size or steps_per_execution (train.steps_per_execution).",
        )

    if share["kernel_launch_ms"] >= 10:
        add(
            share["kernel_launch_ms"],
            "too many small kernels",
            f"{share['kernel_launch_ms']:.1f}% of step time launches kernels",
            "Compile the step with XLA (train.jit_compile: true) to fuse kernels, and run several steps per "
            "host round trip (train.steps_per_execution).",
        )
    if share["compile_ms"] >= 10:
        add(
            share["compile_ms"],
            "recompilation",
            f"{share['compile_ms']:.1f}% of step time compiles",
            "Keep shapes static (pipeline.drop_remainder: true) so the step is traced and compiled once.",
        )
    if share["device_to_device_ms"] + share["output_ms"] >= 10:
        add(
            share["device_to_device_ms"] + share["output_ms"],
            "device copies",
            f"{share['device_to_device_ms'] + share['output_ms']:.1f}% of step time copies between devices/host",
            "Keep tensors on the device; ship uint8 images and convert on the device (the models here do).",
        )

    if has_device:
        busy = profile["device_busy_percent"]
        if share["host_compute_ms"] >= 20:
            add(
                share["host_compute_ms"],
                "work placed on the host",
                f"{share['host_compute_ms']:.1f}% of step time is host compute while a device is present",
                "Check op placement (tf.debugging.set_log_device_placement(True)); move preprocessing into tf.data "
                "or onto the device.",
            )
        if busy < 50 and input_share < analysis.INPUT_BOUND_HIGH:
            add(
                100 - busy,
                "model too small for the device",
                f"the device computes only {busy:.1f}% of each step and input is not the cause",
                "Give each step more work: larger batch, steps_per_execution, XLA; or a larger model.",
            )
        precision = _get(config, "train", "precision")
        if busy >= 50 and precision in (None, "float32"):
            add(
                busy / 2,
                "float32 where mixed precision would serve",
                f"the device computes {busy:.1f}% of each step" + (" in float32" if precision == "float32" else ""),
                "Use mixed precision on tensor-core GPUs (train.precision: mixed_float16 or auto).",
            )
    elif input_share < analysis.INPUT_BOUND_HIGH:
        add(
            share["host_compute_ms"] / 4,
            "no accelerator in the profile",
            f"CPU-only profile: {share['host_compute_ms']:.1f}% of step time is compute on the CPU",
            "This is the ceiling of this CPU; on a GPU host run the same config (`make docker-train-optimized`).",
        )

    found.sort(key=lambda r: r["score"], reverse=True)
    return found


def diagnose(logdir: str | Path) -> dict:
    logdir = Path(logdir)
    if not logdir.exists():
        raise UserError(f"Log folder '{logdir}' does not exist. Pass a TensorBoard log folder, e.g. runs/compare.")
    sessions = analysis.find_profile_sessions(logdir)
    if not sessions:
        raise UserError(
            f"No TensorBoard profile under '{logdir}' (no plugins/profile/*/*.xplane.pb). " + HOW_TO_CAPTURE
        )
    runs = {}
    for run, session in sessions.items():
        try:
            profile = analysis.analyze_session(session)
        except analysis.ProfileError as error:
            runs[run] = {"verdict": "unreadable", "error": str(error), "recommendations": []}
            continue
        config = _run_config(session)
        runs[run] = {
            "verdict": verdict(profile),
            "profile": profile,
            "recommendations": recommendations(profile, config),
            "how_to_capture": None if profile["has_step_markers"] else HOW_TO_CAPTURE,
        }
    return {"logdir": str(logdir), "runs": runs}


def render(result: dict) -> str:
    lines = []
    for run, item in result["runs"].items():
        lines.append(f"== {run} ==")
        if item["verdict"] == "unreadable":
            lines.append(f"  could not read the profile: {item['error']}")
            continue
        profile = item["profile"]
        lines.append(f"  profile: {profile['session']} ({profile['hardware_type']}, {profile['steps']} steps)")
        if item["verdict"] == "unknown":
            lines.append("  verdict: unknown - the profile has no step markers, so xprof measured no step time.")
            lines.append(f"  {item['how_to_capture']}")
            continue
        lines.append(f"  verdict: {item['verdict'].upper()}")
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
        if profile["slow_stages"]:
            stages = ", ".join(f"{s['stage']} {s['self_time_percent']:.0f}%" for s in profile["slow_stages"][:3])
            lines.append(f"  busiest tf.data stages (self time): {stages}")
        lines.append(f"  xprof: {profile['conclusion']}")
        for rank, rec in enumerate(item["recommendations"], start=1):
            lines.append(f"  {rank}. {rec['cause']}: {rec['evidence']}.")
            lines.append(f"     fix: {rec['fix']}")
        if not item["recommendations"]:
            lines.append("  nothing to fix: the step is not held back by any known cause.")
    return "\n".join(lines)


def main(logdir: str, as_json: bool = False, fail_if_input_bound: float | None = None) -> int:
    result = diagnose(logdir)
    print(json.dumps(result, indent=2) if as_json else render(result))
    if fail_if_input_bound is not None:
        worst = [
            (run, item["profile"]["input_bound_percent"])
            for run, item in result["runs"].items()
            if item.get("profile") and item["profile"]["input_bound_percent"] is not None
        ]
        over = [(run, share) for run, share in worst if share > fail_if_input_bound]
        if over:
            import sys

            names = ", ".join(f"{run} ({share:.1f}%)" for run, share in over)
            print(f"FAIL: input-bound above {fail_if_input_bound}% of step time: {names}", file=sys.stderr)
            return 3
    return 0
