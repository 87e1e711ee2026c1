"""What a loop gets from the run set-up (prepare_run.prepare): the resolved config, its workload and dataset,
the devices and choices, the strategy, this process's cluster task, the global batch, where to resume, what
to skip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tensorflow as tf

from train import workloads
from train.config import Config
from train.training.devices import Devices
from train.training.plan import Choices
from train.training.task import Task


@dataclasses.dataclass
class RunSetup:
    cfg: Config  # resolved: no `auto` left that the plan decides
    spec: object  # the built dataset, as the workload describes it
    found: Devices
    choices: Choices
    strategy: tf.distribute.Strategy
    task: Task  # which process of a cluster this is (TF_CONFIG), not the workload
    global_batch: int
    steps_per_epoch: int
    config_path: str | None = None
    build_hint: str = "make data"
    resume: dict | None = None
    damaged: dict = dataclasses.field(default_factory=dict)  # shard -> readable records (skip_corrupt)
    skipped: list = dataclasses.field(default_factory=list)
    epoch_steps: int = 0  # one pass over the training split: a cache fills in it

    @property
    def workload(self):
        return workloads.get(self.cfg.workload)

    def describe_pipeline(self) -> str:
        """One line naming the stages of this run's training pipeline, for logs and reports."""
        return self.workload.describe_pipeline(self.cfg, self.spec, self.global_batch)

    def cache_filling(self, done_steps: int) -> int:
        """The steps in which this process fills the pipeline's cache (0 without one): one pass over the training
        split, less the steps done before a resume (its first step skips them, through the cache). A worker of a
        cluster makes the pass at the global batch, its own where its shards are an even share."""
        return max(0, self.epoch_steps - done_steps) if self.workload.caches(self.cfg) else 0

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    @property
    def tag(self) -> str:
        return f"[{self.cfg.name}{self.task.label}]"

    def build(
        self, split: str, *, files=None, seed: int | None = None, batch_size: int | None = None
    ) -> tf.data.Dataset:
        """The pipeline of this run for `split` (train: shuffled, repeated; validation: each example once), or
        `files` of it, batched at the global batch unless told otherwise."""
        return self.workload.build_dataset(
            self.cfg,
            self.spec,
            split=split,
            training=split == "train",
            batch_size=batch_size or self.global_batch,
            seed=self.cfg.train.seed if seed is None else seed,
            files=files,
            damaged=self.damaged,
        )
