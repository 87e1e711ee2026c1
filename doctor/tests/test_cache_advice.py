"""A cache is offered after a map only where the trace can say the map is fixed.

A map written after a cache is written there to run every epoch (augmentation), and the draws of stateless random
ops seeded per element can be missing from the trace: the template's per-example augmentation (a row gather and a
select after `cache().shuffle()`) recorded no random op, and the doctor told it to cache the augmented images. Here
a real profile of a heavy map after a cache, with no random op at all: the doctor names the map, offers no cache
after it, and says why and what to do if the map is fixed after all.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from step_doctor import diagnose
from step_doctor.callbacks import StepTraceProfiler

pytestmark = [pytest.mark.slow, pytest.mark.stack]

SIZE = 192


def brightened(image, label):
    """Per-pixel work after the cache, the same every epoch (no draw), which the trace cannot tell from augmentation."""
    image = tf.cast(image, tf.float32)
    for _ in range(6):
        image = tf.clip_by_value(tf.math.sqrt(image * 0.9) * tf.math.sqrt(255.0), 0, 255)
    return tf.cast(image, tf.uint8), label


def test_no_cache_is_offered_after_a_map_that_runs_after_a_cache(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (256, SIZE, SIZE, 3), dtype=np.uint8)
    ds = tf.data.Dataset.from_tensor_slices((images, rng.integers(0, 10, 256))).cache().shuffle(256)
    ds = ds.map(brightened).batch(32).repeat().prefetch(tf.data.AUTOTUNE)
    model = keras.Sequential(
        [keras.Input((SIZE, SIZE, 3)), keras.layers.Rescaling(1 / 255), keras.layers.GlobalAveragePooling2D()]
    )
    model.add(keras.layers.Dense(10))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # from step 12: the cache filled in the first 8 steps (256 images in batches of 32)
    model.fit(ds, steps_per_epoch=30, verbose=0, callbacks=[StepTraceProfiler(tmp_path, start_step=12, num_steps=8)])

    (item,) = diagnose.diagnose(tmp_path).runs.values()
    named = [r for r in item.recommendations + item.latent if r.stage and "Map" in r.stage.rsplit("::", 1)[-1]]
    assert named, [(r.cause, r.stage) for r in item.recommendations + item.latent]
    for r in named:
        assert "cache" not in (r.estimates or {}), r.estimates
        assert "`.cache()` right after it" not in r.fix, r.fix
        assert "runs after a cache" in r.fix and "move the cache after it" in r.fix, r.fix
        assert "shuffle after the cache (`.cache().shuffle(n)`)" in r.fix, r.fix  # a shuffle is under the map
