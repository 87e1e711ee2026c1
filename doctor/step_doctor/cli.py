"""Command line: `step-doctor <command> ...` or `python -m step_doctor <command> ...` (--help lists them).

diagnose        verdict and ranked fixes for any TensorBoard log folder with a profile (no TensorFlow needed)
profile         run your own training script with the capture injected, unchanged, then diagnose it

What they cost (bench-diagnose, bench-profile) is measured by developer tools in a checkout, not in the wheel:
doctor/step_doctor_dev/ (make bench-diagnose, make bench-profile).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from step_doctor.errors import Stopped, UserError


def cmd_diagnose(args) -> int:
    from step_doctor import diagnose

    return diagnose.main(
        args.logdir,
        as_json=args.json,
        fail_if_input_bound=args.fail_if_input_bound,
        allow_unmeasured=args.allow_unmeasured,
    )


def cmd_profile(args) -> int:
    # Before anything starts a thread (numpy's BLAS starts one when imported): a thread that leaves SIGINT and SIGTERM
    # unblocked takes them in place of the loop that forwards them to the command (profile/runner.py).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    from step_doctor.profile import command

    return command.main(args)


def _add_diagnose_command(commands) -> None:
    diagnose = commands.add_parser("diagnose", help="verdict and recommendations for any log folder with a profile")
    diagnose.add_argument("logdir", help="a TensorBoard log folder (searched recursively for plugins/profile)")
    diagnose.add_argument("--json", action="store_true", help="print the result as JSON")
    diagnose.add_argument(
        "--fail-if-input-bound",
        type=float,
        metavar="PCT",
        help="exit with status 3 when a run waits for input PCT%% of step time or more, and with status 4 when "
        "a run's input share could not be measured (unreadable profile, no steps, no tf.data input)",
    )
    diagnose.add_argument(
        "--allow-unmeasured",
        action="store_true",
        help="let runs whose input share could not be measured pass instead of exiting with status 4",
    )
    diagnose.set_defaults(func=cmd_diagnose)


def _profile_parsers(commands) -> None:
    profile = commands.add_parser(
        "profile", help="run your own training script with the profiler injected (no code change), then diagnose it"
    )
    profile.add_argument("--logdir", help="the profile and utilization go here (default: runs/profile/<script>-<time>)")
    window = profile.add_mutually_exclusive_group()
    window.add_argument(
        "--steps",
        metavar="A-B",
        help="capture steps A to B, counted from 0 (Keras fit steps, or a custom loop's step-function calls; "
        "default: 5-16, right after the warm-up)",
    )
    window.add_argument(
        "--seconds", type=float, help="a custom loop's capture length (default: 2 s, at least 12 and at most 50 steps)"
    )
    profile.add_argument("--json", action="store_true", help="print diagnose's JSON document plus the utilization")
    profile.add_argument(
        "--fail-if-input-bound", type=float, metavar="PCT", help="exit with status 3 above PCT%% input-bound"
    )
    profile.add_argument("--allow-unmeasured", action="store_true", help="as for diagnose")
    profile.add_argument(
        "--chown", metavar="UID:GID", help="hand the files written as root back to this user (the Docker service)"
    )
    profile.add_argument(
        "--unsafe-multi-worker",
        action="store_true",
        help="capture MultiWorkerMirroredStrategy workers even where the fix for TensorFlow's profiler crash cannot "
        "load (no C++ compiler, an unchecked TensorFlow): on TensorFlow 2.21 8 of 35 such two-worker runs died",
    )
    profile.add_argument(
        "--prove",
        action="store_true",
        help="then apply the first fixes in memory and measure each, and all together, in paired runs of the "
        "unchanged command (no profiler); writes the proved fixes as a patch of your source",
    )
    profile.add_argument(
        "--rounds", type=int, default=3, help="--prove: rounds of runs (one run without a fix and one per fix each)"
    )
    profile.add_argument(
        "--allow",
        action="append",
        default=[],
        choices=["order"],
        help="--prove: also try fixes that change what the script computes: order (reading files interleaved)",
    )
    profile.add_argument("command_args", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    profile.set_defaults(func=cmd_profile)


def build_parser() -> argparse.ArgumentParser:
    prog = "step-doctor" if os.path.basename(sys.argv[0]) == "step-doctor" else "python -m step_doctor"
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Why your GPU waits: profile a TensorFlow training script unchanged, or diagnose a profile.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_diagnose_command(commands)
    _profile_parsers(commands)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> set[str]:
    """The commands a parser offers (the Makefile and docker-compose.yml may only use these)."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(actions[0].choices)


def run(args, failures: dict[type, int] | None = None) -> int:
    """Run the parsed command: a UserError (or one of `failures`) is one paragraph and its exit status, a stop
    request one line and 128 + its signal, never a traceback."""
    try:
        return args.func(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Stopped as error:
        print(error, file=sys.stderr)
        return error.status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except tuple(failures or ()) as error:
        print(f"error: {error}", file=sys.stderr)
        return failures[type(error)]


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
