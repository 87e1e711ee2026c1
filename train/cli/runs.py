"""The commands that build data, train and serve: data, fit, tensorboard, data-service, launch, k8s, lint."""

from __future__ import annotations

import argparse
import sys

from step_doctor.profile.site import consume_fix
from train.cli import arguments
from train.core.quiet import import_tensorflow


def cmd_data(args) -> int:
    from train import workloads

    if args.scenario != "none":
        import_tensorflow()
        from train import scenario

        args.overlay = scenario.for_preset(args.scenario, args.config).overlays + args.overlay
    cfg = arguments.load(args)
    import_tensorflow()
    workload = workloads.get(cfg.workload)
    spec, built = workload.prepare_data(cfg)
    print(workload.describe_data(spec, built))
    return 0


def cmd_fit(args) -> int:
    cfg = arguments.load(args)  # every config error surfaces before TensorFlow is imported
    from train.training import cluster

    cluster.export(log=print)  # TF_CONFIG from a Kubernetes Indexed Job's pod, when it is not set
    if cfg.profile.enabled and consume_fix.is_multi_worker():  # before TensorFlow loads (the doctor's consume_fix.py)
        fix = consume_fix.load()
        if not fix["safe"]:
            cfg.profile.enabled = False
            print(
                "warning: profile.enabled turned off for this worker: TensorFlow's profiler can crash a "
                "MultiWorkerMirroredStrategy worker when it stops, and the fix against it is not in effect here: "
                f"{consume_fix.refusal(fix)}",
                file=sys.stderr,
            )
    import_tensorflow()

    from train.training import fit_loop

    fit_loop.run(
        cfg,
        config_path=args.config,
        fresh=args.fresh,
        build_hint=arguments.data_command(args.config, args.overlay, args.overrides),
    )
    return 0


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


def cmd_k8s(args) -> int:
    from train.cli import k8s

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
    arguments.overrides_arg(k8s, "config override for the dataset Job and the trainer (repeatable)")
    k8s.add_argument("--storage-class", help="StorageClass of the volumes (default: the cluster's)")
    k8s.add_argument("--out", default="deploy/k8s/rendered", help="output folder (default: %(default)s)")
    k8s.set_defaults(func=cmd_k8s)


def cmd_lint(args) -> int:
    from train.cli import lint

    return lint.main(args.dockerfile, args.compose_file, args.code)


def add_training_parsers(commands) -> None:
    data = commands.add_parser("data", help="build the dataset a config trains on (no-op when built)")
    arguments.config_args(data)
    data.add_argument(
        "--scenario",
        default="none",
        help="overlay the scenario's data too: auto, none (default), a name in configs/scenarios/ or a YAML",
    )
    data.set_defaults(func=cmd_data)

    fit = commands.add_parser("fit", help="train one config into runs/<name>/")
    arguments.config_args(fit)
    fit.add_argument("--name", help="run name (default: the config's name)")
    fit.add_argument(
        "--fresh",
        action="store_true",
        help="start over even if runs/<name> holds an unfinished run (default: resume it)",
    )
    fit.set_defaults(func=cmd_fit)


def add_service_parsers(commands) -> None:
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
    _k8s_parser(commands)

    lint = commands.add_parser(
        "lint",
        help="check the code (ruff, import-linter), Dockerfile (hadolint), docker-compose.yml (Compose v2), the "
        "Kubernetes manifests (kubernetes-validate) and the docs (mkdocs build --strict), offline",
    )
    lint.add_argument("--dockerfile", default="Dockerfile")
    lint.add_argument("--compose-file", default="docker-compose.yml")
    lint.add_argument("--code", default=".", help="folder whose Python code ruff checks (default: %(default)s)")
    lint.set_defaults(func=cmd_lint)
