"""Arguments that several commands share: a config with overlays and overrides, a scenario, trials."""

from __future__ import annotations

import argparse


def config_args(parser: argparse.ArgumentParser, default: str | None = "configs/optimized.yaml") -> None:
    parser.add_argument("--config", default=default, help="preset YAML (default: %(default)s)")
    parser.add_argument(
        "--overlay",
        action="append",
        default=[],
        metavar="YAML",
        help="partial preset merged over --config (repeatable), e.g. configs/scenarios/cpu.yaml",
    )
    overrides_arg(parser, "override one key, e.g. --set pipeline.batch_size=64 (repeatable)")


def overrides_arg(parser: argparse.ArgumentParser, text: str) -> None:
    """--set KEY=VALUE (repeatable) into args.overrides; every command that takes overrides says what they reach."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=text)


def scenario_arg(parser: argparse.ArgumentParser, default: str = "auto", what: str = "every variant") -> None:
    parser.add_argument(
        "--scenario",
        default=default,
        help=f"overlay for {what}: auto (the CPU scenario when no GPU is found), none, a name in "
        "configs/scenarios/ (larger_than_memory) or a YAML (default: %(default)s)",
    )


def trial_args(parser: argparse.ArgumentParser, defaults, rounds_help: str = "interleaved rounds") -> None:
    """--trials and --seconds, with the command's own defaults (train.benchmarks.options)."""
    parser.add_argument("--trials", type=int, default=defaults.rounds, help=f"{rounds_help} (default: %(default)s)")
    parser.add_argument(
        "--seconds", type=float, default=defaults.seconds, help="minimum seconds per trial (default: %(default)s)"
    )


def scenario_args(parser: argparse.ArgumentParser, out: str) -> None:
    """Options shared by the commands that run naive and optimized side by side."""
    parser.add_argument("--naive", default="configs/naive.yaml")
    parser.add_argument("--optimized", default="configs/optimized.yaml")
    scenario_arg(parser)
    overrides_arg(parser, "override applied to every variant (repeatable), e.g. --set model.width=32")
    parser.add_argument("--out", default=out, help="output folder (default: %(default)s)")


def load(args):
    from train import config
    from train.core import files

    return config.load(
        files.project_file(args.config) if args.config else None,
        args.overrides,
        layers=[files.project_file(layer) for layer in args.overlay],
        name=getattr(args, "name", None),
    )


def data_command(config_path: str | None, overlays: list[str] = (), overrides: list[str] = ()) -> str:
    """The command that builds the dataset a config (with these overlays and overrides) trains on: `make data`
    (with the workload's TASK=) where that is its presets' dataset, else the `python -m train data` command."""
    from train import config as config_lib
    from train import workloads
    from train.core import files
    from train.core.errors import UserError

    name = config_lib.workload_of(files.project_file(config_path)) if config_path else workloads.DEFAULT
    workload = workloads.get(name)
    data_sets = [o for o in overrides if o.startswith(workload.data_key + ".")]
    try:
        loaded = config_lib.load(config_path, data_sets, layers=overlays)
        base = config_lib.load(files.project_file(workload.presets.base))
        if get(loaded, workload.data_key) == get(base, workload.data_key):
            return "make data" + workload.make_args
    except UserError:
        pass
    parts = ["python -m train data"]
    if config_path:
        parts.append(f"--config {config_path}")
    parts += [f"--overlay {o}" for o in overlays] + [f"--set {o}" for o in data_sets]
    return " ".join(parts)


def get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
