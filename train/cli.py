"""Command line: `python -m train <command> ...` or `gpu-template <command> ...` (--help lists them)."""

from __future__ import annotations

import argparse
import os
import sys

from train.core.errors import RunFailed, Stopped, UserError
from train.core.quiet import import_tensorflow


def _config_args(parser: argparse.ArgumentParser, default: str | None = "configs/optimized.yaml") -> None:
    parser.add_argument("--config", default=default, help="preset YAML (default: %(default)s)")
    parser.add_argument(
        "--overlay",
        action="append",
        default=[],
        metavar="YAML",
        help="partial preset merged over --config (repeatable), e.g. configs/scenarios/cpu.yaml",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set pipeline.batch_size=64 (repeatable)",
    )


def _scenario_arg(parser: argparse.ArgumentParser, default: str = "auto", what: str = "every variant") -> None:
    parser.add_argument(
        "--scenario",
        default=default,
        help=f"overlay for {what}: auto (the CPU scenario when no GPU is found), none, a name in "
        "configs/scenarios/ (larger_than_memory) or a YAML (default: %(default)s)",
    )


def _trial_args(parser: argparse.ArgumentParser, defaults, rounds_help: str = "interleaved rounds") -> None:
    """--trials and --seconds, with the command's own defaults (train.benchmarks.options)."""
    parser.add_argument("--trials", type=int, default=defaults.rounds, help=f"{rounds_help} (default: %(default)s)")
    parser.add_argument(
        "--seconds", type=float, default=defaults.seconds, help="minimum seconds per trial (default: %(default)s)"
    )


def _scenario_args(parser: argparse.ArgumentParser, out: str) -> None:
    """Options shared by the commands that run naive and optimized side by side."""
    parser.add_argument("--naive", default="configs/naive.yaml")
    parser.add_argument("--optimized", default="configs/optimized.yaml")
    _scenario_arg(parser)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override applied to every variant (repeatable), e.g. --set model.width=32",
    )
    parser.add_argument("--out", default=out, help="output folder (default: %(default)s)")


def _variants(args):
    from train.benchmarks import options

    return options.Variants(args.scenario, args.naive, args.optimized, tuple(args.overrides))


def _trials(args):
    from train.benchmarks import options

    defaults = options.LadderOptions.TRIALS  # bench-check given only one of the two
    return options.Trials(args.trials or defaults.rounds, args.seconds or defaults.seconds)


def benchmark_options(args):
    """The typed options of a benchmark command (train/benchmarks/options.py), from its arguments."""
    from pathlib import Path

    from train.benchmarks import options

    out = Path(args.out)
    if args.command == "compare":
        return options.CompareOptions(_variants(args), out)
    if args.command == "bench":
        return options.BenchOptions(_variants(args), _trials(args), tuple(args.data_service_workers), out)
    if args.command == "ladder":
        return options.LadderOptions(_variants(args), _trials(args), args.ladder, out)
    if args.command == "sweep-batch":
        return options.SweepOptions(_variants(args), _trials(args), args.min, args.max, out)
    if args.command == "bench-check":
        scenarios = tuple(args.scenario or options.CheckOptions.scenarios)
        given = None if args.trials is None and args.seconds is None else _trials(args)
        return options.CheckOptions(scenarios, tuple(args.overrides), given, out)
    return options.TuneOptions(
        config=args.config,
        overlays=tuple(args.overlay),
        overrides=tuple(args.overrides),
        scenario=args.scenario,
        minutes=args.minutes,
        batch=args.batch,
        trials=_trials(args),
        final_rounds=args.final_trials,
        only=tuple(args.only),
        tuned=Path(args.tuned),
        fresh=args.fresh,
        reference=args.reference,
        out=out,
    )


def _load(args):
    from train import config
    from train.core import files

    return config.load(
        files.project_file(args.config) if args.config else None,
        args.overrides,
        layers=[files.project_file(layer) for layer in args.overlay],
        name=getattr(args, "name", None),
    )


def cmd_data(args) -> int:
    from train import sources

    if args.scenario != "none":
        import_tensorflow()
        from train import scenario

        args.overlay = scenario.resolve(args.scenario).overlays + args.overlay
    cfg = _load(args)
    import_tensorflow()
    spec, built = sources.prepare(cfg.data)
    size_mb = sum(os.path.getsize(f) for f in spec.train_files + spec.val_files) / 2**20
    verb = "Built" if built else "Already built (nothing to do)"
    print(
        f"{verb}: {spec.name} at {spec.root}: {spec.num_train} train + {spec.num_val} validation examples, "
        f"{len(spec.train_files)}+{len(spec.val_files)} shards, {size_mb:.1f} MB, "
        f"images {'x'.join(map(str, spec.image_shape))}, {spec.num_classes} classes."
    )
    return 0


def cmd_fit(args) -> int:
    cfg = _load(args)  # every config error surfaces before TensorFlow is imported
    from train.training import cluster

    cluster.export(log=print)  # TF_CONFIG from a Kubernetes Indexed Job's pod, when it is not set
    import_tensorflow()

    from train import sources
    from train.training import fit_loop

    fit_loop.run(
        cfg,
        config_path=args.config,
        fresh=args.fresh,
        build_hint=sources.data_command(args.config, args.overlay, args.overrides),
    )
    return 0


def _benchmark(module: str, args) -> int:
    """Run train.benchmarks.<module>.main(options), TensorFlow imported without its start-up log."""
    import importlib

    opts = benchmark_options(args)
    import_tensorflow()
    return importlib.import_module(f"train.benchmarks.{module}").main(opts)


def cmd_compare(args) -> int:
    return _benchmark("compare", args)


def cmd_bench(args) -> int:
    return _benchmark("bench", args)


def cmd_bench_check(args) -> int:
    return _benchmark("check", args)


def cmd_ladder(args) -> int:
    return _benchmark("ladder", args)


def cmd_tune(args) -> int:
    return _benchmark("tune", args)


def cmd_sweep(args) -> int:
    return _benchmark("sweep", args)


def cmd_bench_diagnose(args) -> int:
    return _benchmark("bench_diagnose", args)


def cmd_diagnose(args) -> int:
    from train import diagnose

    return diagnose.main(
        args.logdir,
        as_json=args.json,
        fail_if_input_bound=args.fail_if_input_bound,
        allow_unmeasured=args.allow_unmeasured,
    )


def cmd_tensorboard(args) -> int:
    from tensorboard import program

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: TensorBoard will listen on {args.host}: anyone who can reach this host sees the runs.",
            file=sys.stderr,
        )
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", args.logdir, "--host", args.host, "--port", str(args.port)])
    print(f"TensorBoard: http://{args.host}:{args.port}/  (Profile tab: #profile)  Ctrl-C stops it.")
    board.main()
    return 0


def cmd_data_service(args) -> int:
    from train.input import service

    return service.main(args)


def cmd_launch(args) -> int:
    from train.training import launch

    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    return launch.launch(args.workers, command)


def cmd_profile(args) -> int:
    from train.profile import command

    return command.main(args)


def cmd_bench_profile(args) -> int:
    from train.profile import bench

    return bench.main(args)


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


def cmd_k8s(args) -> int:
    from train.training import k8s

    return k8s.main(args)


def _k8s_parser(commands) -> None:
    k8s = commands.add_parser(
        "k8s", help="render the Kubernetes manifests (deploy/k8s/) for an image and a number of workers"
    )
    k8s.add_argument("--image", default="gpu-utilization-template:latest", help="the image every pod runs")
    k8s.add_argument("--workers", type=int, default=2, help="trainer pods, one per worker (default: %(default)s)")
    k8s.add_argument("--gpus-per-worker", type=int, default=1, help="nvidia.com/gpu per trainer pod; 0 for CPU")
    k8s.add_argument("--data-workers", type=int, default=2, help="tf.data service workers; 0 renders no data service")
    k8s.add_argument("--config", default="configs/optimized.yaml", help="the preset the pods run (in the image)")
    k8s.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for the dataset Job and the trainer (repeatable)",
    )
    k8s.add_argument("--storage-class", help="StorageClass of the volumes (default: the cluster's)")
    k8s.add_argument("--out", default="deploy/k8s/rendered", help="output folder (default: %(default)s)")
    k8s.set_defaults(func=cmd_k8s)


def cmd_lint(args) -> int:
    from train import lint

    return lint.main(args.dockerfile, args.compose_file, args.code)


def _add_benchmark_commands(commands) -> None:
    """compare, bench, bench-check, ladder, sweep-batch (defaults: train/benchmarks/options.py)."""
    from train.benchmarks import options

    compare = commands.add_parser("compare", help="train naive and optimized on the same data and model, report")
    _scenario_args(compare, out="runs/compare")
    compare.set_defaults(func=cmd_compare)

    bench = commands.add_parser("bench", help="naive vs optimized vs the compute ceiling: interleaved trials")
    _scenario_args(bench, out="runs/bench")
    _trial_args(bench, options.BenchOptions.TRIALS)
    bench.add_argument(
        "--data-service-workers",
        type=int,
        nargs="*",
        default=list(options.BenchOptions.data_service_workers),
        metavar="N",
        help="also run the optimized pipeline on a local tf.data service with N workers "
        "(default: 1 2; the flag with no N skips them)",
    )
    bench.set_defaults(func=cmd_bench)

    check = commands.add_parser(
        "bench-check", help="check the benchmark harness: A/A and order checks of bench, ladder and tune's pairing"
    )
    check.add_argument(
        "--scenario",
        action="append",
        help="a scenario to check (repeatable; default: " + " and ".join(options.CheckOptions.scenarios) + ")",
    )
    check.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override for every variant"
    )
    check.add_argument("--trials", type=int, help="rounds of every check (default: each command's own)")
    check.add_argument("--seconds", type=float, help="minimum seconds per trial (default: each command's own)")
    check.add_argument("--out", default=str(options.CheckOptions.out), help="output folder (default: %(default)s)")
    check.set_defaults(func=cmd_bench_check)

    ladder = commands.add_parser("ladder", help="turn on one optimization at a time from naive, measure each")
    _scenario_args(ladder, out="runs/ladder")
    ladder.add_argument(
        "--ladder",
        help="the rungs (default: configs/ladder/<scenario>.yaml for a named scenario that has one, else "
        "configs/ladder/ladder.yaml)",
    )
    _trial_args(ladder, options.LadderOptions.TRIALS, "paired rounds per rung")
    ladder.set_defaults(func=cmd_ladder)

    sweep = commands.add_parser("sweep-batch", help="throughput and utilization against batch size")
    _scenario_args(sweep, out="runs/sweep-batch")
    sweep.add_argument(
        "--min", type=int, default=options.SweepOptions.min_batch, help="smallest batch (default: %(default)s)"
    )
    sweep.add_argument(
        "--max", type=int, default=options.SweepOptions.max_batch, help="largest batch to try (default: %(default)s)"
    )
    _trial_args(sweep, options.SweepOptions.TRIALS, "trials per batch size")
    sweep.set_defaults(func=cmd_sweep)


def _add_tune_command(commands) -> None:
    from train.benchmarks import options

    tune = commands.add_parser(
        "tune", help="search the speed knobs (not what is learned) for this data and machine -> configs/tuned.yaml"
    )
    _config_args(tune)
    _scenario_arg(tune, what="the config, under --overlay")
    tune.add_argument(
        "--minutes",
        type=float,
        default=options.TuneOptions.minutes,
        help="budget for search and final check (default: %(default)s)",
    )
    tune.add_argument(
        "--batch",
        action="store_true",
        help="also search pipeline.batch_size, scaling train.learning_rate linearly (changes what is learned)",
    )
    _trial_args(tune, options.TuneOptions.TRIALS, "interleaved rounds per candidate")
    tune.add_argument(
        "--final-trials",
        type=int,
        default=options.TuneOptions.final_rounds,
        help="rounds of the final check (default: %(default)s)",
    )
    tune.add_argument("--only", action="append", default=[], metavar="KEY", help="search only this knob (repeatable)")
    tune.add_argument(
        "--tuned",
        default=str(options.TuneOptions.tuned),
        help="the overlay to start from when it exists and to write (default: %(default)s)",
    )
    tune.add_argument("--fresh", action="store_true", help="ignore an existing --tuned overlay at the start")
    tune.add_argument(
        "--reference",
        metavar="YAML",
        help="also measure this preset in the final check's rounds, with the scenario but without --overlay/--set, "
        "e.g. configs/optimized.yaml",
    )
    tune.add_argument("--out", default=str(options.TuneOptions.out), help="output folder (default: %(default)s)")
    tune.set_defaults(func=cmd_tune)


def build_parser() -> argparse.ArgumentParser:
    prog = "gpu-template" if os.path.basename(sys.argv[0]) == "gpu-template" else "python -m train"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    data = commands.add_parser("data", help="build the dataset a config trains on (no-op when built)")
    _config_args(data)
    data.add_argument(
        "--scenario",
        default="none",
        help="overlay the scenario's data too: auto, none (default), a name in configs/scenarios/ or a YAML",
    )
    data.set_defaults(func=cmd_data)

    fit = commands.add_parser("fit", help="train one config into runs/<name>/")
    _config_args(fit)
    fit.add_argument("--name", help="run name (default: the config's name)")
    fit.add_argument(
        "--fresh",
        action="store_true",
        help="start over even if runs/<name> holds an unfinished run (default: resume it)",
    )
    fit.set_defaults(func=cmd_fit)

    _add_benchmark_commands(commands)
    _add_tune_command(commands)

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

    bench_diagnose = commands.add_parser(
        "bench-diagnose", help="wall time and peak memory of diagnose against profile size (captures up to 1 GB)"
    )
    bench_diagnose.add_argument("--out", default="runs/bench-diagnose", help="output folder (default: %(default)s)")
    bench_diagnose.add_argument(
        "--sizes",
        type=float,
        nargs="*",
        default=[1, 10, 100, 1000],
        metavar="MB",
        help="sizes of the GPU-shaped profiles (default: %(default)s)",
    )
    bench_diagnose.add_argument(
        "--captures",
        type=int,
        nargs="*",
        default=[12, 120, 600],
        metavar="STEPS",
        help="real captures measured too, in steps (default: %(default)s)",
    )
    bench_diagnose.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    bench_diagnose.add_argument(
        "--max-mb", type=float, default=float("inf"), help="leave out profiles larger than this (default: none)"
    )
    bench_diagnose.add_argument(
        "--code", help="measure the diagnose of this checkout instead (e.g. a worktree of main at an older commit)"
    )
    bench_diagnose.add_argument("--name", help="file name of the results (default: bench, or bench-<code folder>)")
    bench_diagnose.add_argument(
        "--timeout", type=float, default=900.0, help="seconds one diagnose may take (default: %(default)s)"
    )
    bench_diagnose.set_defaults(func=cmd_bench_diagnose)

    board = commands.add_parser("tensorboard", help="serve a log folder with TensorBoard (localhost by default)")
    board.add_argument("--logdir", default="runs")
    board.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s, this machine only)")
    board.add_argument("--port", type=int, default=6006)
    board.set_defaults(func=cmd_tensorboard)

    service = commands.add_parser("data-service", help="run a tf.data service dispatcher or worker")
    service.add_argument("role", choices=["dispatcher", "worker"])
    service.add_argument("--port", type=int, default=5050, help="port to serve on (default: %(default)s)")
    service.add_argument("--dispatcher", default="localhost:5050", help="worker: the dispatcher's HOST:PORT")
    service.add_argument(
        "--advertise",
        default="localhost",
        help="worker: the host name the trainer uses to reach this worker (default: %(default)s)",
    )
    service.add_argument("--work-dir", help="dispatcher: folder for its journal, so it survives restarts")
    service.set_defaults(func=cmd_data_service)

    launch = commands.add_parser("launch", help="run a command as N local multi-worker processes (TF_CONFIG set)")
    launch.add_argument("--workers", type=int, default=2, help="number of worker processes (default: %(default)s)")
    launch.add_argument(
        "command_args",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="what each worker runs, e.g. -- fit --config configs/optimized.yaml",
    )
    launch.set_defaults(func=cmd_launch)

    _profile_parsers(commands)
    _k8s_parser(commands)

    lint = commands.add_parser(
        "lint",
        help="check the code (ruff), Dockerfile (hadolint), docker-compose.yml (Compose v2) and the Kubernetes "
        "manifests (kubernetes-validate), offline",
    )
    lint.add_argument("--dockerfile", default="Dockerfile")
    lint.add_argument("--compose-file", default="docker-compose.yml")
    lint.add_argument("--code", default=".", help="folder whose Python code ruff checks (default: %(default)s)")
    lint.set_defaults(func=cmd_lint)

    return parser


def command_names() -> set[str]:
    """The commands this CLI offers (the Makefile and docker-compose.yml may only use these)."""
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(actions[0].choices)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RunFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    except Stopped as error:
        print(error, file=sys.stderr)
        return error.status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
