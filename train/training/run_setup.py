"""What a loop gets from the run set-up (setup.prepare): the resolved config, the dataset, the devices
and choices, the strategy, this process's task, the global batch, where to resume, what to skip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tensorflow as tf

from train.config import Config
from train.input import pipeline
from train.shards.spec import DatasetSpec
from train.training.devices import Devices
from train.training.plan import Choices
from train.training.task import Task
from train.workloads.text import pipeline as text_pipeline
from train.workloads.text.spec import TextSpec


@dataclasses.dataclass
class RunSetup:
    cfg: Config  # resolved: no `auto` left that the plan decides
    spec: DatasetSpec | TextSpec  # TextSpec when cfg.task is text
    found: Devices
    choices: Choices
    strategy: tf.distribute.Strategy
    task: Task
    global_batch: int
    steps_per_epoch: int
    config_path: str | None = None
    build_hint: str = "make data"
    resume: dict | None = None
    damaged: dict = dataclasses.field(default_factory=dict)  # shard -> readable records (skip_corrupt)
    skipped: list = dataclasses.field(default_factory=list)

    def describe_pipeline(self) -> str:
        """One line naming the stages of this run's training pipeline, for logs and reports."""
        if self.cfg.task == "text":
            return text_pipeline.describe(self.cfg.text.pipeline, self.spec, self.global_batch)
        return pipeline.describe(self.cfg.pipeline, self.spec, self.spec.num_train, self.global_batch)

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
        self, files_, *, training: bool, seed: int | None = None, batch_size: int | None = None
    ) -> tf.data.Dataset:
        """The pipeline of this run for `files_`, batched at the global batch unless told otherwise. Text: `files_`
        are the spec's token shards (train_files or val_files); reader python reads the same split's raw shards."""
        if self.cfg.task == "text":
            knobs = self.cfg.text.pipeline
            training_split = tuple(files_) == tuple(self.spec.train_files)
            return text_pipeline.build(
                text_pipeline.input_files(self.spec, knobs, training_split),
                self.spec,
                knobs,
                training=training,
                batch_size=batch_size or self.global_batch,
                seed=self.cfg.train.seed if seed is None else seed,
            )
        return pipeline.build(
            files_,
            self.spec,
            self.cfg.pipeline,
            training=training,
            batch_size=batch_size or self.global_batch,
            seed=self.cfg.train.seed if seed is None else seed,
            damaged=self.damaged,
        )
