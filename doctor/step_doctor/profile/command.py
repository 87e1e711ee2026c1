"""`step-doctor profile [--logdir DIR] [--steps A-B | --seconds S] [--json] -- python my_train.py ARGS...`

Runs the command with the capture injected (runner.py, site/), then diagnoses what it captured:
the summary line, the causes with their estimated gains and fixes, the utilization around the
run, and the TensorBoard command that shows the profile and the utilization side by side.

Exit status: the command's own when it failed (one line names how it ended; what it captured
is still diagnosed), else diagnose's: 0, 3 with --fail-if-input-bound, 4 when nothing could be
measured; 2 when the command is not a Python one, never imports TensorFlow, or cannot start.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

from step_doctor import diagnose as analyser  # the analyser's entry points: diagnose(), render(), main()
from step_doctor import files
from step_doctor.diagnose.diagnosis import Diagnosis, RunDiagnosis
from step_doctor.errors import UserError
from step_doctor.profile import explain, prove, runner
from step_doctor.tensorboard import text_summary


def main(args) -> int:
    command = args.command_args[1:] if args.command_args[:1] == ["--"] else list(args.command_args)
    if not command:
        raise UserError(
            "Give the command to profile after --, as you would run it yourself: "
            "step-doctor profile -- python my_train.py --epochs 3"
        )
    if args.seconds is not None and args.seconds <= 0:
        raise UserError(f"--seconds {args.seconds}: give the length of a custom loop's capture in seconds, e.g. 5.")
    steps = runner.parse_steps(args.steps)
    if args.prove and args.rounds < 2:
        raise UserError(
            f"--rounds {args.rounds}: --prove needs at least 2 rounds (its A/A control compares the runs without a "
            "fix of two rounds); the default is 3."
        )
    shown = Path(args.logdir) if args.logdir else runner.default_logdir(command)
    logdir = runner.prepare_logdir(shown)
    if steps:
        window = f"steps {steps[0]}-{steps[1]} (Keras fit steps, or a custom loop's step-function calls)"
    else:
        loop = f"{args.seconds:g} s" if args.seconds else "2 s (12 to 50 steps)"
        window = f"Keras fit steps 5-16 (after the warm-up), or {loop} of a custom loop from its 6th step"
    print(
        f"profile: running `{explain.command_text(command)}`; capture: {window}; logs in {shown}",
        file=sys.stderr,
        flush=True,
    )
    started = time.time()
    child, sampler = runner.run(
        command,
        logdir,
        steps,
        args.seconds,
        args.json,
        name=runner.script_name(command),
        unsafe_multi_worker=args.unsafe_multi_worker,
        prove=args.prove,
    )
    try:
        proved = _prove(args, child, logdir, command) if args.prove else None
        return _report(args, child, sampler, logdir, shown, proved)
    finally:
        if args.chown:
            runner.hand_back([logdir, Path.cwd()], args.chown, started)


WRITES_STATE = {"BackupAndRestore"}  # callbacks that a run cut short leaves state behind for the next run to resume


def _prove(args, child: runner.ChildRun, logdir: Path, command: list[str]) -> dict | None:
    """Measure the first fixes (prove.py) where the command's own process was captured and diagnosed; else why not."""
    name = runner.script_name(command)
    status = next((s for s in child.statuses if s.get("run") == name), None)
    captured = [s for s in child.statuses if (s.get("capture") or {}).get("state") == "done"]
    why = None
    if child.signals or child.returncode < 0:
        why = f"the command was stopped ({', '.join(child.signals) or child.signal_name})"
    elif status is None or not any(logdir.rglob("*.xplane.pb")):
        why = "the command's own process captured nothing"
    elif len(captured) > 1:
        why = f"the command ran {len(captured)} training processes; prove measures a command of one"
    elif set(status.get("callbacks") or ()) & WRITES_STATE:
        why = (
            "the script trains with keras.callbacks.BackupAndRestore: prove's runs end after a window of steps, and "
            "each would leave a backup that the next run (and yours) resumes from"
        )
    if why is None:
        item = analyser.diagnose(str(logdir)).runs.get(name)
        if not isinstance(item, RunDiagnosis) or not item.recommendations:
            why = "the diagnosis names no fix to measure"
    if why:
        print(f"prove: nothing measured: {why}.", file=sys.stderr, flush=True)
        return {"each": [], "together": None, "skipped": why}
    # Blocked again (runner._watch unblocked them once the command ended): prove takes them itself, between trials
    # and in the wait for each, to stop the running trial and report the rounds measured.
    before = signal.pthread_sigmask(signal.SIG_BLOCK, runner.FORWARDED)
    try:
        return prove.prove(command, item, status, logdir / name, args.rounds, set(args.allow), Path.cwd())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _report(args, child: runner.ChildRun, sampler, logdir: Path, shown: Path, proved: dict | None = None) -> int:
    usage = explain.utilization_block(sampler, child)
    about = {
        "command": child.command,
        "exit_status": child.exit_status,
        "signal": child.signal_name,
        "seconds": round(child.seconds, 3),
        "processes": child.statuses,
    }
    board = f"tensorboard --logdir {shown}"
    if not any(logdir.rglob("*.xplane.pb")):
        paragraph, status = explain.nothing_captured(child)
        document = {"logdir": None, "runs": {}, "error": paragraph, "capture": about, "utilization": usage}
        runner.discard(logdir)
        if args.json:
            print(json.dumps(document, indent=2, default=str))
        print(f"error: {paragraph}", file=sys.stderr)
        return status
    result = analyser.diagnose(str(logdir))
    status = analyser.gate(result, args.fail_if_input_bound, args.allow_unmeasured)
    result = _loop_hints(result, child)
    document = {**result.to_json(), "logdir": str(shown), "capture": about, "utilization": usage, "tensorboard": board}
    if proved is not None:
        document["prove"] = proved
    files.write_json(logdir / "profile.json", document)
    text_summary.write_diagnosis(logdir, result)  # the verdict in TensorBoard's Text tab too
    if args.json:
        print(json.dumps(document, indent=2, default=str))
    else:
        lines = explain.capture_lines(child) + [analyser.render(result), ""]
        lines += explain.utilization_lines(usage)
        if proved is not None and proved.get("each"):
            lines += prove.lines(proved) + [""]
        lines.append(f"TensorBoard, the profile and the utilization side by side: {board}")
        print("\n".join(lines))
    if child.returncode != 0:
        print(
            f"error: `{explain.command_text(child.command)}` {explain.how_it_ended(child)}; what it captured before "
            "is diagnosed above.",
            file=sys.stderr,
        )
        return child.exit_status
    return status


def _loop_hints(result: Diagnosis, child: runner.ChildRun) -> Diagnosis:
    """A custom loop's steps are inferred by design: say how, instead of the analyser's advice to add markers."""
    loops = {s["run"]: s for s in child.statuses if s.get("mode") == "custom-loop" and s.get("run")}
    runs = dict(result.runs)
    for run, item in result.runs.items():
        status = loops.get(run)
        if status and isinstance(item, RunDiagnosis) and item.how_to_capture:
            runs[run] = dataclasses.replace(
                item,
                how_to_capture=(
                    f"A custom loop has no Keras batches to mark: its steps are the executions of "
                    f"`{(status.get('window') or {}).get('function')}`, its step function, each from one call to the "
                    "next (so fetching the next batch between calls counts as waiting for input)."
                ),
            )
    return dataclasses.replace(result, runs=runs)
