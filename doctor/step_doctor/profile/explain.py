"""What `profile` says about the run around the diagnosis: what was captured where, the utilization,
and, when nothing could be captured, one paragraph saying why and what to do."""

from __future__ import annotations

import shlex

from step_doctor.profile.runner import ChildRun

MIN_STEPS = 3  # the analyser leaves the first captured step out and needs two more


def command_text(command: list[str]) -> str:
    return shlex.join(command)


def how_it_ended(child: ChildRun) -> str:
    """'exited with status 1 after 12.0 s', 'was stopped by Ctrl-C (SIGINT) after ...', '... killed by SIGTERM ...'."""
    after = f"after {child.seconds:.1f} s"
    name = child.signal_name
    if name is None:
        return f"exited with status {child.returncode} {after}"
    if name == "SIGINT":
        return f"was stopped by Ctrl-C (SIGINT) {after}"
    sent = " (profile received it and passed it on)" if name in child.signals else ""
    return f"was killed by {name}{sent} {after}"


def capture_lines(child: ChildRun) -> list[str]:
    """One line per process that captured (or tried to), then the notes the processes left."""
    lines = []
    for status in child.statuses:
        capture = status.get("capture")
        if not capture:
            continue
        run = _run_name(status)
        where = run
        window = status.get("window") or {}
        if status.get("mode") == "keras-fit":
            steps = window.get("steps") or ["?", "?"]
            what = f"Keras fit, steps {steps[0]}-{capture.get('last_step', steps[1])} with step markers"
            origin = window.get("from")
            if origin and origin != "default":
                what += f" (window: {origin})"
        else:
            seconds = (capture.get("stopped_at") or capture.get("started_at", 0)) - capture.get("started_at", 0)
            first, last = window.get("from_call", "?"), capture.get("last_step", "?")
            what = f"a custom loop, calls {first}-{last} of `{window.get('function')}` over {max(seconds, 0):.1f} s"
        state = capture.get("state")
        if state == "done":
            lines.append(f"captured in {where} (pid {status['pid']}): {what}.")
        elif state == "failed":
            lines.append(f"the profiler failed in {where} (pid {status['pid']}): {capture.get('error')}.")
        elif state == "stopping":
            lines.append(_died_stopping(status, "Run profile again; what the others captured is diagnosed below."))
        ended = _ended_early(status)
        if ended:
            lines.append(ended)
    for status in child.statuses:
        lines.extend(status.get("notes") or [])
    return lines


def _run_name(status: dict) -> str:
    return status.get("run") or f"pid-{status['pid']}"


def _died_stopping(status: dict, then: str) -> str:
    return (
        f"{_run_name(status)} (pid {status['pid']}) died inside tf.profiler.experimental.stop(), while TensorFlow "
        "collected and wrote its session: nothing of it was written. This is a native crash in TensorFlow's "
        "profiler, not in your script: a use-after-free in TraceMeRecorder::Consume, which struck 8 of 35 profiled "
        "runs of two MultiWorkerMirroredStrategy workers on TensorFlow 2.21 (none of 35 without the profiler). "
        f"{_fix_state(status)}{then}"
    )


def _fix_state(status: dict) -> str:
    """What became of the fix profile loads against that crash in this process (site/consume_fix.py)."""
    fix = status.get("consume_fix")
    if not fix:
        return ""
    if fix["loaded"]:
        return f"The fix against it was loaded ({fix['library']}): a crash it does not cover, please report it. "
    if fix.get("safe"):
        return f"The fix was not needed ({fix['why']}): a crash it does not cover, please report it. "
    return f"The fix against it was not in effect ({fix['why']}). "


def _ended_early(status: dict) -> str | None:
    capture, window = status.get("capture") or {}, status.get("window") or {}
    steps = window.get("steps")
    if capture.get("state") != "done" or not steps or status.get("mode") != "keras-fit":
        return None
    last = capture.get("last_step", steps[1])
    if last >= steps[1]:
        return None
    return (
        f"The run ended at step {last}, before the window's last step {steps[1]}: the profile holds steps "
        f"{steps[0]}-{last}. {_suggest(last + 1)}"
    )


def _suggest(seen: int) -> str:
    if seen - 1 >= MIN_STEPS:
        first = max(1, seen - 12)
        return f"To capture whole steps that the run reaches, rerun with --steps {first}-{seen - 1}."
    return f"It ran {seen} step(s); a profile needs at least {MIN_STEPS + 1} (the first is left out): train longer."


def nothing_captured(child: ChildRun) -> tuple[str, int]:
    """The one paragraph when no process wrote a profile, and the exit status."""
    command = f"`{command_text(child.command)}`"
    failed = child.returncode != 0
    ended = how_it_ended(child)
    statuses = child.statuses
    fallback = child.exit_status if failed else 2
    if not statuses:
        return (
            f"{command} {ended}, but no Python process it started loaded profile's start-up hook, so nothing was "
            "captured: it is not a Python command. profile runs Python training scripts: `python my_train.py ...`, "
            "a script with a python shebang, or a launcher that starts Python with this environment (PYTHONPATH and "
            "STEP_DOCTOR_PROFILE). Python started with -I, -E or -S skips the hook.",
            fallback,
        )
    if not any(s.get("tensorflow_at") or s.get("jax_at") for s in statuses):
        return (
            f"{command} {ended} and never imported TensorFlow or JAX, so there was nothing to capture: profile "
            "captures TensorFlow and JAX training (Keras fit, a custom loop that calls a tf.function step, a JAX loop)."
            + (" Its own output above says why it failed." if failed else ""),
            fallback,
        )
    for status in statuses:
        capture = status.get("capture") or {}
        if capture.get("state") == "stopping":
            return f"{command} {ended}: " + _died_stopping(status, "Run profile again."), child.exit_status
        if capture.get("state") in ("skipped", "failed"):
            reason = capture.get("error")
            return (
                f"{command} {ended}; profile's capture could not start at {capture.get('at')} ({reason}). "
                + " ".join(status.get("notes") or []),
                child.exit_status if failed else 4,
            )
    return _never_reached(command, ended, statuses, failed), child.exit_status if failed else 4


def _never_reached(command: str, ended: str, statuses: list[dict], failed: bool) -> str:
    fits = [s for s in statuses if s.get("mode") == "keras-fit"]
    if fits:
        seen = max(s.get("steps_seen", 0) for s in fits)
        steps = max(fits, key=lambda s: s.get("steps_seen", 0)).get("window") or {}
        window = f" (steps {steps['steps'][0]}-{steps['steps'][1]})" if steps.get("steps") else ""
        return (
            f"{command} {ended}: Keras fit ran {seen} step(s) (steps 0-{seen - 1}) and stopped before the capture "
            f"window{window} began, so nothing was captured. {_suggest(seen)}"
        )
    called = [s["most_called"] for s in statuses if s.get("most_called")]
    if called:
        top = max(called, key=lambda c: c["calls"])
        return (
            f"{command} {ended}: its most-called tf.function, `{top['function']}`, ran {top['calls']} time(s); a "
            "custom loop is captured from its step function's 6th call on (--steps A-B to choose), so nothing was "
            f"captured. {_suggest(top['calls'])}"
        )
    jax = [s for s in statuses if s.get("jax_at")]
    if jax:
        took = max(s["jax_at"] for s in jax) - min(s["started_at"] for s in statuses)
        compiles = max(s.get("jax_compiles", 0) for s in jax)
        return (
            f"{command} {ended}. It imported JAX ({took:.1f} s after start) and compiled {compiles} time(s), but no "
            "window was captured: a plain JAX loop is captured over a time window that starts once JAX has not "
            "compiled for 1 s (at most 10 s after its first compile), and the script ended before that. Train "
            "longer, or capture it yourself (jax.profiler.start_trace(logdir) / stop_trace() around some steps) "
            "and run `step-doctor diagnose logdir`." + (" Its own output above says why it failed." if failed else "")
        )
    took = max(s.get("tensorflow_at", 0) for s in statuses) - min(s["started_at"] for s in statuses)
    return (
        f"{command} {ended}. It imported TensorFlow ({took:.1f} s after start) but never trained: no Keras fit step "
        "and no tf.function called repeatedly (a custom loop's step), which is what profile captures. A loop that "
        "runs eagerly (no @tf.function, or run_eagerly=True) shows no step to capture: decorate the train step with "
        "@tf.function." + (" Its own output above says why it failed." if failed else "")
    )


def utilization_block(sampler, child: ChildRun) -> dict:
    """The sampler's summary over the whole run, and over each capture window long enough for a sample."""
    windows = []
    for status in child.statuses:
        capture = status.get("capture") or {}
        if capture.get("state") == "done":
            since, until = capture["started_at"], capture["stopped_at"]
            inside = [row for row in sampler.samples if since <= row["time"] <= until]
            window = {"run": status.get("run"), "seconds": round(until - since, 3), "samples": len(inside)}
            windows.append({**window, **sampler.summary(since, until)} if inside else window)
    whole = {"seconds": round(child.seconds, 3), **sampler.summary()}
    return {"interval_s": sampler.interval_s, "whole_run": whole, "during_capture": windows}


def utilization_lines(block: dict) -> list[str]:
    whole = block["whole_run"]
    lines = [f"utilization, whole run ({whole['seconds']:.1f} s, {whole['samples']} samples): {_figures(whole)}"]
    for window in block["during_capture"]:
        head = f"utilization, during the capture of {window['run']} ({window['seconds']:.2f} s)"
        if window["samples"]:
            lines.append(f"{head}: {_figures(window)}")
        else:
            lines.append(f"{head}: shorter than one sample (every {block['interval_s']:g} s)")
    return lines


def _figures(summary: dict) -> str:
    cpu = summary["cpu_utilization_percent"]
    text = f"host CPU {cpu['mean']:.0f} % mean, {cpu['p95']:.0f} % p95" if cpu else "host CPU n/a"
    if not summary["gpu_available"]:
        return f"{text}; GPU n/a ({summary['gpu_unavailable_reason']})"
    for gpu in summary["gpus"]:
        parts = [f"GPU {gpu['index']} ({gpu['name']})"]
        for key, label in (
            ("utilization_percent", "utilization"),
            ("sm_activity_percent", "SM activity"),
            ("tensor_activity_percent", "tensor cores"),
        ):
            figure = gpu.get(key)
            parts.append(f"{label} {figure['mean']:.0f} % mean" if figure else f"{label} n/a")
        text += "; " + ", ".join(parts)
    if summary.get("gpm_unavailable_reason"):
        text += f" (SM and tensor-core activity n/a: {summary['gpm_unavailable_reason']})"
    return text
