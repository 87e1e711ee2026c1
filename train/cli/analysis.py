"""The commands that read profiles: diagnose any log folder, profile a script of your own, what profile costs."""

from __future__ import annotations

import argparse


def cmd_diagnose(args) -> int:
    from train import diagnose

    return diagnose.main(
        args.logdir,
        as_json=args.json,
        fail_if_input_bound=args.fail_if_input_bound,
        allow_unmeasured=args.allow_unmeasured,
    )


def cmd_profile(args) -> int:
    from train.profile import command

    return command.main(args)


def cmd_bench_profile(args) -> int:
    from train.profile import bench

    return bench.main(args)


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
    profile.add_argument("command_args", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    profile.set_defaults(func=cmd_profile)

    bench = commands.add_parser(
        "bench-profile", help="what profile costs: a corpus script with and without it, interleaved trials"
    )
    bench.add_argument("--trials", type=int, default=7, help="pairs of trials, with and without (default: %(default)s)")
    bench.add_argument("--case", default="tiny_batch", help="the corpus case (default: %(default)s)")
    bench.add_argument("--steps", type=int, default=3000, help="training steps per trial (default: %(default)s)")
    bench.add_argument("--out", default="runs/bench-profile", help="output folder (default: %(default)s)")
    bench.set_defaults(func=cmd_bench_profile)


def add_parsers(commands) -> None:
    _add_diagnose_command(commands)
    _profile_parsers(commands)
