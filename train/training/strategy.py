"""The tf.distribute strategy a resolved config names (train.strategy).

TensorFlow fixes its devices when it first uses them: create the strategy before any other
TensorFlow op of the run (the plan does, plan.plan).
"""

from __future__ import annotations

import tensorflow as tf

from train.config import Config
from train.training import devices


def make_strategy(cfg: Config) -> tf.distribute.Strategy:
    """default: this process's one device; mirrored: every GPU of this host (or train.cpu_replicas
    logical CPUs where there is none); multi_worker: one replica set per TF_CONFIG worker."""
    name = cfg.train.strategy
    if name == "multi_worker":
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=cfg.train.collective_timeout_s)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "mirrored":
        if not tf.config.list_physical_devices("GPU") and cfg.train.cpu_replicas > 1:
            devices.split_cpu(cfg.train.cpu_replicas)
            return tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(cfg.train.cpu_replicas)])
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
