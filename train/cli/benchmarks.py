"""The benchmark commands: compare, bench, bench-check, ladder, sweep-batch, tune, prove.

Their defaults and typed options live in train/benchmarks/options.py; this module only turns arguments into them.
"""

from __future__ import annotations

from pathlib import Path

from train.cli import arguments
from train.core.errors import UserError
from train.core.quiet import import_tensorflow


def _variants(args):
    from train.benchmarks import options

    return options.Variants(args.scenario, args.naive, args.optimized, tuple(args.overrides))


def _trials(args):
    from train.benchmarks import options

    defaults = options.LadderOptions.TRIALS  # bench-check given only one of the two
    return options.Trials(args.trials or defaults.rounds, args.seconds or defaults.seconds)


def _workload(preset: str | None):
    """The workload a preset trains (its `workload:`), read without loading the config."""
    from train import config, workloads
    from train.core import files

    return workloads.get(config.workload_of(files.project_file(preset)) if preset else workloads.DEFAULT)


def _refuse_data_service(args) -> None:
    """bench's tf.data service variants, asked for a workload whose pipeline does not run on the service."""
    from train.core.errors import UserError

    if args.command != "bench" or not args.data_service_workers:
        return
    workload = _workload(args.naive)
    if not workload.features.data_service:
        raise UserError(
            f"`bench --data-service-workers {' '.join(map(str, args.data_service_workers))}`: the tf.data service "
            f"variants are measured for workloads whose pipeline runs on the service only ({args.naive} has "
            f"workload: {workload.name}). Run its bench without the flag (make bench{workload.make_args})."
        )


def benchmark_options(args):
    """The typed options of a benchmark command (train/benchmarks/options.py), from its arguments."""
    from train.benchmarks import options

    _refuse_data_service(args)
    out = Path(args.out)
    if args.command == "compare":
        return options.CompareOptions(_variants(args), out)
    if args.command == "bench":
        workers = args.data_service_workers
        if workers is None:  # not given: 1 and 2 workers where the workload's pipeline runs on the service
            service = _workload(args.naive).features.data_service
            workers = options.BenchOptions.data_service_workers if service else ()
        return options.BenchOptions(_variants(args), _trials(args), tuple(workers), out)
    if args.command == "ladder":
        return options.LadderOptions(_variants(args), _trials(args), args.ladder, out)
    if args.command == "sweep-batch":
        largest = args.max
        if largest is None:
            largest = _workload(args.optimized).max_sweep_batch or options.SweepOptions.max_batch
        return options.SweepOptions(_variants(args), _trials(args), args.min, largest, out)
    if args.command == "prove":
        return options.ProveOptions(
            run=Path(args.run) if args.run else None,
            config=args.config,
            optimized=args.optimized,
            scenario=args.scenario,
            overrides=tuple(args.overrides),
            allow=tuple(name for given in args.allow for name in given.split(",") if name),
            passes=args.passes,
            trials=_trials(args),
            out=out,
        )
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
        tuned=Path(args.tuned or _workload(args.config).presets.tuned),
        fresh=args.fresh,
        reference=args.reference,
        out=out,
    )


def _options_with_tensorflow(args):
    """The command's typed options (every argument error first), then TensorFlow imported without its start-up
    log: each command below imports its module after this."""
    opts = benchmark_options(args)
    import_tensorflow()
    return opts


def cmd_compare(args) -> int:
    opts = _options_with_tensorflow(args)
    from train.benchmarks import compare

    return compare.main(opts)


def cmd_bench(args) -> int:
    opts = _options_with_tensorflow(args)
    from train.benchmarks import bench

    return bench.main(opts)


def cmd_bench_check(args) -> int:
    if args.pool:
        measuring = {
            "--scenario": args.scenario,
            "--set": args.overrides,
            "--trials": args.trials,
            "--seconds": args.seconds,
        }
        given = [flag for flag, value in measuring.items() if value]
        if given:
            raise UserError(
                f"bench-check --pool reads earlier runs' check.json and measures nothing, so {', '.join(given)} "
                "does not apply: give --pool with --out only."
            )
        from train.benchmarks import check_pool

        return check_pool.main([Path(folder) for folder in args.pool], Path(args.out))
    opts = _options_with_tensorflow(args)
    from train.benchmarks import check

    return check.main(opts)


def cmd_ladder(args) -> int:
    opts = _options_with_tensorflow(args)
    from train.benchmarks import ladder

    return ladder.main(opts)


def cmd_tune(args) -> int:
    opts = _options_with_tensorflow(args)
    from train.benchmarks import tune

    return tune.main(opts)


def cmd_prove(args) -> int:
    opts = _options_with_tensorflow(args)
    from train.benchmarks import prove

    return prove.main(opts)


def cmd_sweep(args) -> int:
    opts = _options_with_tensorflow(args)
    from train.benchmarks import sweep

    return sweep.main(opts)


def _add_benchmark_commands(commands) -> None:
    """compare, bench, bench-check, ladder, sweep-batch (defaults: train/benchmarks/options.py)."""
    from train.benchmarks import options

    compare = commands.add_parser("compare", help="train naive and optimized on the same data and model, report")
    arguments.scenario_args(compare, out="runs/compare")
    compare.set_defaults(func=cmd_compare)

    bench = commands.add_parser("bench", help="naive vs optimized vs the compute ceiling: interleaved trials")
    arguments.scenario_args(bench, out="runs/bench")
    arguments.trial_args(bench, options.BenchOptions.TRIALS)
    bench.add_argument(
        "--data-service-workers",
        type=int,
        nargs="*",
        default=None,
        metavar="N",
        help="also run the optimized pipeline on a local tf.data service with N workers "
        "(default: 1 2 where the workload's pipeline runs on the service, images; the flag with no N skips them)",
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
    arguments.overrides_arg(check, "override for every variant")
    check.add_argument("--trials", type=int, help="rounds of every check (default: each command's own)")
    check.add_argument("--seconds", type=float, help="minimum seconds per trial (default: each command's own)")
    check.add_argument("--out", default=str(options.CheckOptions.out), help="output folder (default: %(default)s)")
    check.add_argument(
        "--pool",
        nargs="+",
        metavar="DIR",
        help="measure nothing: pool the A/A rounds of earlier runs (their --out folders, one machine kind) and say "
        "whether each pairing centres within 1%% of 1.00 -> OUT/pooled.{json,md}",
    )
    check.set_defaults(func=cmd_bench_check)

    ladder = commands.add_parser("ladder", help="turn on one optimization at a time from naive, measure each")
    arguments.scenario_args(ladder, out="runs/ladder")
    ladder.add_argument(
        "--ladder",
        help="the rungs (default: configs/ladder/<scenario>.yaml for a named scenario that has one, else "
        "configs/ladder/ladder.yaml)",
    )
    arguments.trial_args(ladder, options.LadderOptions.TRIALS, "paired rounds per rung")
    ladder.set_defaults(func=cmd_ladder)

    sweep = commands.add_parser("sweep-batch", help="throughput and utilization against batch size")
    arguments.scenario_args(sweep, out="runs/sweep-batch")
    sweep.add_argument(
        "--min", type=int, default=options.SweepOptions.min_batch, help="smallest batch (default: %(default)s)"
    )
    sweep.add_argument(
        "--max",
        type=int,
        default=None,
        help=f"largest batch to try (default: {options.SweepOptions.max_batch}, or the workload's own: text, 256 "
        "texts of the longest length)",
    )
    arguments.trial_args(sweep, options.SweepOptions.TRIALS, "trials per batch size")
    sweep.set_defaults(func=cmd_sweep)


def _add_tune_command(commands) -> None:
    from train.benchmarks import options

    tune = commands.add_parser(
        "tune", help="search the speed knobs (not what is learned) for this data and machine -> configs/tuned.yaml"
    )
    arguments.config_args(tune)
    arguments.scenario_arg(tune, what="the config, under --overlay")
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
    arguments.trial_args(tune, options.TuneOptions.TRIALS, "interleaved rounds per candidate")
    tune.add_argument(
        "--final-trials",
        type=int,
        default=options.TuneOptions.final_rounds,
        help="rounds of the final check (default: %(default)s)",
    )
    tune.add_argument("--only", action="append", default=[], metavar="KEY", help="search only this knob (repeatable)")
    tune.add_argument(
        "--tuned",
        default=None,
        help=f"the overlay to start from when it exists and to write (default: tuned.yaml beside the workload's "
        f"presets: {options.TuneOptions.tuned}, configs/text/tuned.yaml)",
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


def _add_prove_command(commands) -> None:
    from train.benchmarks import options

    defaults = options.ProveOptions
    prove = commands.add_parser(
        "prove", help="the doctor's fixes for a run of this template, each measured as a config overlay"
    )
    prove.add_argument(
        "--run", help="the run the doctor reads (default: make compare's run of --config, runs/compare/naive)"
    )
    prove.add_argument("--config", default=defaults.config, help="the config that run trained (default: %(default)s)")
    prove.add_argument("--optimized", default=defaults.optimized, help="the preset to reach (default: %(default)s)")
    arguments.scenario_arg(prove)
    arguments.overrides_arg(prove, "override applied to every variant (repeatable)")
    prove.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="also try the fixes that change what is learned: generator (tf.data ops for the Python generator and "
        "its augmentation), batch (a batch of 256), precision (mixed precision)",
    )
    prove.add_argument(
        "--passes",
        type=int,
        default=defaults.passes,
        help="passes: each after the first trains the config with the fixes proved so far and profiles it, to find "
        "what they uncovered (default: %(default)s)",
    )
    arguments.trial_args(prove, defaults.TRIALS, "paired rounds per fix")
    prove.add_argument("--out", default=str(defaults.out), help="output folder (default: %(default)s)")
    prove.set_defaults(func=cmd_prove)


def add_parsers(commands) -> None:
    _add_benchmark_commands(commands)
    _add_tune_command(commands)
    _add_prove_command(commands)
