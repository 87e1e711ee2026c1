"""The run's model, compiled: the workload's model (train/models.py's registry) with the loss, optimizer and
metrics of train/models.py, under the planned precision policy, distribution strategy, XLA and steps per
execution. The workload builds the model (images with pipeline.augment: device start with the augmentation
layer, so the saved model holds it too) and says which metrics arguments it needs.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from train import models, workloads
from train.config import Config
from train.training.plan import Choices


def learning_rate(cfg: Config, replicas: int, total_steps: int | None = None):
    """The peak rate (times the replicas under the linear scaling rule), decaying along a cosine to 1 %
    over `total_steps`, so the last epochs settle instead of jumping around the minimum."""
    peak = cfg.train.learning_rate * (replicas if cfg.train.scale_learning_rate else 1)
    if total_steps:
        return keras.optimizers.schedules.CosineDecay(peak, decay_steps=total_steps, alpha=0.01)
    return peak


def build_model(
    cfg: Config,
    spec,
    choices: Choices,
    strategy: tf.distribute.Strategy,
    total_steps: int | None = None,
) -> keras.Model:
    """The compiled model of `cfg` under its precision policy and distribution strategy."""
    keras.mixed_precision.set_global_policy(choices.precision)
    workload = workloads.get(cfg.workload)

    def build():
        return workload.build_model(cfg, spec)

    initial = None
    if strategy.num_replicas_in_sync > 1:
        # Initialized outside the strategy, so that the same seed gives the same starting
        # weights with or without distribution (strategies draw initial values differently).
        initial = build()
    with strategy.scope():
        model = build()
        if initial is not None:
            model.set_weights(initial.get_weights())
        # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer itself.
        model.compile(
            optimizer=models.optimizer(learning_rate(cfg, strategy.num_replicas_in_sync, total_steps)),
            loss=models.loss(),
            **workload.metrics(cfg),
            jit_compile=choices.jit_compile,
            steps_per_execution=choices.steps_per_execution,
        )
    return model
