"""Command line: `python -m train <command> ...` or `gpu-template <command> ...` (--help lists them).

The doctor's commands (diagnose, profile, bench-profile, bench-diagnose) are its own: `step-doctor --help`.

runs.py         data, fit, tensorboard, data-service, launch, k8s, lint
benchmarks.py   compare, bench, bench-check, ladder, sweep-batch, tune
arguments.py    the arguments several commands share (a config, a scenario, trials)
"""

from __future__ import annotations

import argparse
import os
import sys

from step_doctor import cli as doctor_cli
from train.cli import benchmarks, runs
from train.core.errors import RunFailed


def build_parser() -> argparse.ArgumentParser:
    prog = "gpu-template" if os.path.basename(sys.argv[0]) == "gpu-template" else "python -m train"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runs.add_training_parsers(commands)
    benchmarks.add_parsers(commands)
    runs.add_service_parsers(commands)
    return parser


def command_names() -> set[str]:
    """The commands this CLI offers (the Makefile and docker-compose.yml may only use these)."""
    return doctor_cli.subcommands(build_parser())


def main(argv: list[str] | None = None) -> int:
    return doctor_cli.run(build_parser().parse_args(argv), failures={RunFailed: 3})
