"""What each benchmark command takes, typed: train/cli/benchmarks.py builds these from the command line.

The defaults live here, once: `--scenario`, `--trials` and `--seconds` mean the same thing in
every command, and each command's own defaults (how many rounds, how long a trial) are the
`Trials` value of its class.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Trials:
    rounds: int  # interleaved rounds: every variant measured once per round
    seconds: float  # the shortest trial (a trial also runs at least a few executions)


@dataclasses.dataclass(frozen=True)
class Variants:
    """The scenario and the two presets every comparison starts from."""

    scenario: str = "auto"  # auto | none | a name in configs/scenarios/ | a YAML overlay
    naive: str = "configs/naive.yaml"
    optimized: str = "configs/optimized.yaml"
    overrides: tuple[str, ...] = ()  # --set KEY=VALUE for every variant


@dataclasses.dataclass(frozen=True)
class CompareOptions:
    variants: Variants = Variants()
    out: Path = Path("runs/compare")


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    TRIALS = Trials(rounds=9, seconds=3.0)
    variants: Variants = Variants()
    trials: Trials = TRIALS
    data_service_workers: tuple[int, ...] = (1, 2)
    out: Path = Path("runs/bench")


@dataclasses.dataclass(frozen=True)
class LadderOptions:
    TRIALS = Trials(rounds=5, seconds=2.0)
    variants: Variants = Variants()
    trials: Trials = TRIALS
    ladder: str | None = None  # None: configs/ladder/<scenario>.yaml where the scenario has one
    out: Path = Path("runs/ladder")


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    TRIALS = Trials(rounds=3, seconds=2.0)
    variants: Variants = Variants()
    trials: Trials = TRIALS
    min_batch: int = 16
    max_batch: int = 2048
    out: Path = Path("runs/sweep-batch")


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    TRIALS = Trials(rounds=5, seconds=1.0)
    config: str = "configs/optimized.yaml"
    overlays: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    scenario: str = "auto"
    minutes: float = 10.0  # the search and the final check together
    batch: bool = False  # also search pipeline.batch_size (the learning rate moves with it)
    trials: Trials = TRIALS
    final_rounds: int = 9
    only: tuple[str, ...] = ()
    tuned: Path = Path("configs/tuned.yaml")  # the command line's default: the workload's presets folder
    fresh: bool = False
    reference: str | None = None
    out: Path = Path("runs/tune")


@dataclasses.dataclass(frozen=True)
class ProveOptions:
    TRIALS = Trials(rounds=3, seconds=3.0)
    run: Path | None = None  # the run whose profile the doctor reads; None: make compare's run of `config`
    config: str = "configs/naive.yaml"  # the config that run trained
    optimized: str = "configs/optimized.yaml"
    scenario: str = "auto"
    overrides: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()  # generator, batch, precision: fixes that change what is learned
    passes: int = 3  # each after profiling the config with the fixes proved before it
    trials: Trials = TRIALS
    out: Path = Path("runs/prove")


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    scenarios: tuple[str, ...] = ("auto", "larger_than_memory")
    overrides: tuple[str, ...] = ()
    trials: Trials | None = None  # None: each pairing with its own command's rounds and trial length
    out: Path = Path("runs/bench-check")
