"""The rules between a config's values that types alone cannot say: ranges, and knobs that need each other.

config.py types every knob; this module checks what those types allow but a run cannot use (a learning
rate of 0, a checkpoint every 0 epochs); each workload's settings.py checks its own sections (a batch
of 0, a disk cache without a folder). All problems of a config are found and said together, each
naming the key, its value and what it must be. It reads a config's values and imports nothing of
config.py, which calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from train.core.errors import UserError


class Problems(list):
    """Range and consistency problems of a config, one sentence each."""

    def need(self, ok: bool, key: str, value: Any, rule: str) -> None:
        if not ok:
            self.append(f"'{key}' is {value!r} but must be {rule}")


def check_ranges(cfg, source: str, check_sections: Callable) -> None:
    """Every range and consistency rule (`check_sections`: the workload's, on its sections); all problems found,
    raised as one UserError."""
    problems = Problems()
    check_sections(cfg.sections, problems.need)
    _check_train(cfg.train, problems.need)
    _check_run(cfg, problems.need)
    if problems:
        raise UserError(f"{source}: " + "; ".join(problems) + ". Fix the value(s) and run again.")


def _check_train(t, need) -> None:
    need(t.epochs >= 1, "train.epochs", t.epochs, ">= 1")
    need(t.learning_rate > 0, "train.learning_rate", t.learning_rate, "> 0")
    need(
        t.steps_per_epoch is None or t.steps_per_epoch >= 1, "train.steps_per_epoch", t.steps_per_epoch, "null or >= 1"
    )
    need(t.warmup_steps == "auto" or t.warmup_steps >= 0, "train.warmup_steps", t.warmup_steps, "'auto' or >= 0")
    need(
        t.steps_per_execution == "auto" or t.steps_per_execution >= 1,
        "train.steps_per_execution",
        t.steps_per_execution,
        "'auto' or >= 1",
    )
    need(t.cpu_replicas >= 1, "train.cpu_replicas", t.cpu_replicas, ">= 1")
    need(t.collective_timeout_s > 0, "train.collective_timeout_s", t.collective_timeout_s, "> 0")
    need(
        t.stall_timeout_s == "auto" or t.stall_timeout_s >= 0,
        "train.stall_timeout_s",
        t.stall_timeout_s,
        "'auto' or >= 0",
    )


def _check_run(cfg, need) -> None:
    need(cfg.checkpoint.every_epochs >= 1, "checkpoint.every_epochs", cfg.checkpoint.every_epochs, ">= 1")
    need(cfg.checkpoint.every_steps >= 0, "checkpoint.every_steps", cfg.checkpoint.every_steps, ">= 0")
    need(cfg.checkpoint.keep >= 1, "checkpoint.keep", cfg.checkpoint.keep, ">= 1")
    need(cfg.profile.start_step >= 0, "profile.start_step", cfg.profile.start_step, ">= 0")
    need(cfg.profile.num_steps >= 1, "profile.num_steps", cfg.profile.num_steps, ">= 1")
    need(cfg.monitor.interval_s > 0, "monitor.interval_s", cfg.monitor.interval_s, "> 0")
    need(
        bool(cfg.name) and "/" not in cfg.name and cfg.name not in (".", ".."),
        "name",
        cfg.name,
        "a non-empty folder name without '/'",
    )
