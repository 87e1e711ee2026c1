"""Which process of a (possibly multi-worker) run this is, from TF_CONFIG.

The chief alone writes the run folder; every worker reads the same config and checkpoints.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf


@dataclasses.dataclass
class Task:
    kind: str = "local"  # local | worker | chief
    index: int = 0
    workers: int = 1
    is_chief: bool = True

    @property
    def label(self) -> str:
        return "" if self.kind == "local" else f" {self.kind} {self.index}"


def current_task() -> Task:
    """This process's place in the cluster that TF_CONFIG describes (a local run without it)."""
    if "TF_CONFIG" not in os.environ:
        return Task()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    kind, index = resolver.task_type or "worker", resolver.task_id or 0
    cluster = resolver.cluster_spec().as_dict()
    workers = sum(len(cluster.get(name, [])) for name in ("chief", "worker"))
    is_chief = kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)
    return Task(kind, index, workers, is_chief)
