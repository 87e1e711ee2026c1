"""The run's model, compiled: train/models.py's model, loss, optimizer and metrics under the
planned precision policy, distribution strategy, XLA and steps per execution.

With pipeline.augment: device the model starts with the augmentation layer
(augment.DeviceAugment), so the saved model holds it too. A text model (task: text) takes the token
ids of train/workloads/text/pipeline.py; run_summary.finish saves it behind the dataset's TextVectorization too.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from train import models
from train.config import Config
from train.input import augment, pipeline
from train.shards.spec import DatasetSpec
from train.training.plan import Choices


def learning_rate(cfg: Config, replicas: int, total_steps: int | None = None):
    """The peak rate (times the replicas under the linear scaling rule), decaying along a cosine to 1 %
    over `total_steps`, so the last epochs settle instead of jumping around the minimum."""
    peak = cfg.train.learning_rate * (replicas if cfg.train.scale_learning_rate else 1)
    if total_steps:
        return keras.optimizers.schedules.CosineDecay(peak, decay_steps=total_steps, alpha=0.01)
    return peak


def text_input(cfg: Config, spec):
    """What a text model's inputs look like for this run (train/workloads/text/model.py's TokenInput)."""
    from train.workloads.text.model import TokenInput

    knobs = cfg.text.pipeline
    return TokenInput(spec.vocab_size, spec.max_length, knobs.batching == "pack", knobs.max_segments)


def build_model(
    cfg: Config,
    spec: DatasetSpec,
    choices: Choices,
    strategy: tf.distribute.Strategy,
    total_steps: int | None = None,
) -> keras.Model:
    """The compiled model of `cfg` under its precision policy and distribution strategy."""
    keras.mixed_precision.set_global_policy(choices.precision)
    packed = cfg.task == "text" and cfg.text.pipeline.batching == "pack"
    if cfg.task == "text":
        shape = text_input(cfg, spec)
    else:
        shape = pipeline.image_shape(spec, cfg.pipeline)

    def build():
        if cfg.task == "text":
            return models.build_model(cfg.model.name, shape, spec.num_classes, cfg.model.params)
        model = models.build_model(cfg.model.name, shape, spec.num_classes, cfg.model.params)
        if cfg.pipeline.augment != "device" or not cfg.pipeline.transforms:
            return model
        images = keras.Input(shape=shape, dtype="uint8", name="image")
        layer = augment.DeviceAugment(seed=cfg.train.seed, transforms=cfg.pipeline.transforms, name="device_augment")
        augmented = layer(images)
        return keras.Model(images, model(augmented), name=model.name)

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
            # packed rows carry a weight per segment slot: 0 where a row holds fewer texts than max_segments
            metrics=None if packed else models.metrics(),
            weighted_metrics=models.metrics() if packed else None,
            jit_compile=choices.jit_compile,
            steps_per_execution=choices.steps_per_execution,
        )
    return model
