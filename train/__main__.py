"""Command line: python -m train <command> ...  (run with --help for the list)."""

from __future__ import annotations

import argparse
import os
import sys

from train.errors import UserError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def _config_args(parser: argparse.ArgumentParser, default: str | None = "configs/optimized.yaml") -> None:
    parser.add_argument("--config", default=default, help="preset YAML (default: %(default)s)")
    parser.add_argument("--overlay", action="append", default=[], metavar="YAML",
                        help="partial preset merged over --config (repeatable), e.g. configs/scenarios/cpu.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one key, e.g. --set pipeline.batch_size=64 (repeatable)")


def _load(args):
    from train import config

    return config.load(args.config, args.overrides, layers=args.overlay, name=getattr(args, "name", None))


def cmd_data(args) -> int:
    from train import datasets

    cfg = _load(args)
    spec, built = datasets.prepare(cfg.data)
    size_mb = sum(os.path.getsize(f) for f in spec.train_files + spec.val_files) / 2**20
    verb = "Built" if built else "Already built (nothing to do)"
    print(f"{verb}: {spec.name} at {spec.root}: {spec.num_train} train + {spec.num_val} validation examples, "
          f"{len(spec.train_files)}+{len(spec.val_files)} shards, {size_mb:.1f} MB, "
          f"images {'x'.join(map(str, spec.image_shape))}, {spec.num_classes} classes.")
    return 0


def cmd_fit(args) -> int:
    from train import datasets, fit

    cfg = _load(args)
    fit.run(cfg, config_path=args.config,
            build_hint=datasets.data_command(args.config, args.overlay, args.overrides))
    return 0


def cmd_compare(args) -> int:
    from train import compare

    return compare.main(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    data = commands.add_parser("data", help="build the dataset a config trains on (no-op when built)")
    _config_args(data)
    data.set_defaults(func=cmd_data)

    fit = commands.add_parser("fit", help="train one config into runs/<name>/")
    _config_args(fit)
    fit.add_argument("--name", help="run name (default: the config's name)")
    fit.set_defaults(func=cmd_fit)

    compare = commands.add_parser("compare", help="train naive and optimized on the same data and model, report")
    compare.add_argument("--naive", default="configs/naive.yaml")
    compare.add_argument("--optimized", default="configs/optimized.yaml")
    compare.add_argument("--scenario", default="auto",
                         help="overlay for both runs: auto (the CPU scenario when no GPU is found), none, or a YAML")
    compare.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override applied to both runs (repeatable)")
    compare.add_argument("--out", default="runs/compare", help="folder for both runs and the report")
    compare.set_defaults(func=cmd_compare)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
