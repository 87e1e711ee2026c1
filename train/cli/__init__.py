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

from train.cli import benchmarks, runs
from train.core.errors import RunFailed, Stopped, UserError


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
