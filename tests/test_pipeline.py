import dataclasses
import hashlib
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import ROOT, build_pipeline
from train import config
from train.workloads.image import augment, pipeline
from train.workloads.image.choices import pipeline_choices

ALL = augment.Transforms.of(augment.TRANSFORMS)


def knobs(preset: str, **changes):
    return dataclasses.replace(config.load(ROOT / f"configs/{preset}.yaml").pipeline, **changes)


def decided(spec, knob, num_examples=None, gpu=False):
    """`knob` with the `auto`s a run's plan decides decided for `spec`."""
    return pipeline_choices(knob, spec, gpu=gpu, num_examples=num_examples)[0]


def one_epoch(spec, knob, training=True, batch_size=16):
    dataset = build_pipeline(spec, knob, training=training, batch_size=batch_size, files=spec.train_files)
    steps = pipeline.steps_per_epoch(spec.num_train, batch_size, drop_remainder=True)
    examples = []
    for images, labels in dataset.take(steps):
        assert images.dtype == tf.uint8 and images.shape[1:] == spec.image_shape
        examples += [
            (int(label), hashlib.sha1(image.tobytes()).hexdigest())
            for image, label in zip(images.numpy(), labels.numpy())
        ]
    return examples


def test_naive_and_optimized_yield_the_same_examples(tiny_spec):
    naive = one_epoch(tiny_spec, knobs("naive", augment="none"))
    optimized = one_epoch(tiny_spec, knobs("optimized", augment="none"))
    assert len(naive) == tiny_spec.num_train
    assert Counter(naive) == Counter(optimized)


def test_shuffling_changes_the_order(tiny_spec):
    in_order = one_epoch(tiny_spec, knobs("optimized", augment="none"), training=False)
    first = one_epoch(tiny_spec, knobs("optimized", augment="none", deterministic=True))
    assert Counter(first) == Counter(in_order)
    assert first != in_order
    naive = one_epoch(tiny_spec, knobs("naive", augment="none"))
    assert naive != in_order


def test_each_epoch_is_reshuffled(tiny_spec):
    knob = knobs("optimized", augment="none", deterministic=True)
    dataset = build_pipeline(tiny_spec, knob, training=True, batch_size=tiny_spec.num_train)
    epochs = [labels.numpy().tolist() for _, labels in dataset.take(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) and epochs[0] != epochs[1]


def test_validation_reads_everything_in_order_without_dropping(tiny_spec):
    knob = knobs("optimized")
    dataset = build_pipeline(tiny_spec, knob, training=False, batch_size=24)
    sizes = [int(labels.shape[0]) for _, labels in dataset]
    assert sizes == [24, 8]


def test_naive_preset_really_has_no_prefetch(tiny_spec):
    naive = build_pipeline(tiny_spec, knobs("naive"), training=True, batch_size=32)
    assert naive.options().experimental_optimization.inject_prefetch is False
    optimized = build_pipeline(tiny_spec, knobs("optimized"), training=True, batch_size=32)
    assert optimized.options().threading.max_intra_op_parallelism == 1


@pytest.mark.parametrize(
    "flip_lr, flip_ud, dy", [(False, False, 0), (True, False, 2), (False, True, -2), (True, True, 1)]
)
def test_the_augmentations_agree(flip_lr, flip_ud, dy):
    """numpy (naive generator), eager TF, and TF inside tf.data give the same pixels."""
    image = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    expected = augment.numpy_apply(image, flip_lr, flip_ud, dy)
    args = (tf.constant([flip_ud]), tf.constant([dy]), int(flip_lr))
    eager = augment.tf_apply(tf.constant(image[None]), *args)[0].numpy()
    inside = tf.data.Dataset.from_tensors(image[None]).map(lambda x: augment.tf_apply(x, *args)[0])
    stacked, _ = augment.add_mirror(tf.constant(image), 0)
    mirrored = augment.tf_apply_mirrored(stacked[None], tf.constant([flip_lr]), *args[:2])[0].numpy()
    assert (eager == expected).all()
    assert (next(iter(inside)).numpy() == expected).all()
    assert (mirrored == expected).all()


def test_flip_and_shift_mean_what_they_say():
    image = np.arange(16, dtype=np.uint8).reshape(4, 4, 1)
    assert (augment.numpy_apply(image, True, False, 0)[:, :, 0] == image[:, ::-1, 0]).all()
    assert (augment.numpy_apply(image, False, True, 0)[:, :, 0] == image[::-1, :, 0]).all()
    shifted = augment.numpy_apply(image, False, False, 1)[:, :, 0]
    assert (shifted[1:] == image[:-1, :, 0]).all() and (shifted[0] == image[0, :, 0]).all()


def test_batched_augmentation_draws_every_flip_and_shift_per_example():
    images = np.random.default_rng(1).integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    stacked = tf.stack([augment.add_mirror(tf.constant(image), 0)[0] for image in images])
    assert stacked.shape == (6, 16, 8, 3)
    flip_lr = [False, True, True, False, True, False]
    flip_ud = [True, False, False, True, False, True]
    dy = [0, 1, -1, 0, 2, -2]
    out = augment.tf_apply_mirrored(stacked, tf.constant(flip_lr), tf.constant(flip_ud), tf.constant(dy)).numpy()
    for index in range(6):
        expected = augment.numpy_apply(images[index], flip_lr[index], flip_ud[index], dy[index])
        assert (out[index] == expected).all()


def _seen(original: np.ndarray, outputs) -> set[str]:
    """The transforms each output shows, found by matching it against every combination numpy_apply makes."""
    shift = augment.max_shift(original.shape[0])
    combos = {
        (lr, ud, dy): augment.numpy_apply(original, lr, ud, dy)
        for lr in (False, True)
        for ud in (False, True)
        for dy in range(-shift, shift + 1)
    }
    seen = set()
    for out in outputs:
        lr, ud, dy = next(key for key, image in combos.items() if (image == out).all())
        seen |= {name for name, on in (("flip_left_right", lr), ("flip_up_down", ud), ("shift", dy != 0)) if on}
    return seen


def _placements(image: np.ndarray, transforms: augment.Transforms, draws: int = 48):
    """The augmented image `draws` times from each placement: numpy, per example, batched (mirrored and plain),
    and the device layer."""
    rng = np.random.default_rng(0)
    yield "python", [augment.numpy_augment(image, rng, transforms) for _ in range(draws)]
    yield "per_example", [augment.tf_augment_one(i, (image, 0), 0, transforms)[0].numpy() for i in range(draws)]
    stacked = tf.stack([augment.add_mirror(tf.constant(image), 0)[0]] * draws)
    yield "batched (mirrored)", augment.tf_augment_batch(0, (stacked, tf.zeros([draws])), 0, transforms)[0].numpy()
    plain = tf.constant(np.stack([image] * draws))
    yield "batched", augment.tf_augment_plain_batch(0, (plain, tf.zeros([draws])), 0, transforms)[0].numpy()
    layer = augment.DeviceAugment(seed=0, transforms=transforms.names)
    yield "device", layer(plain, training=True).numpy()


@pytest.mark.parametrize("names", [[], ["flip_left_right"], ["flip_up_down"], ["shift"], list(augment.TRANSFORMS)])
def test_every_placement_applies_exactly_the_listed_transforms(names):
    image = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)  # every pixel distinct: each move shows
    transforms = augment.Transforms.of(names)
    for placement, outputs in _placements(image, transforms):
        assert _seen(image, outputs) == set(names), placement


def test_the_default_transforms_are_right_for_photos_and_the_built_in_data_adds_the_up_down_flip():
    from train.config import load
    from train.workloads.image.settings import PipelineConfig

    assert PipelineConfig().transforms == ["flip_left_right", "shift"]
    base = load(ROOT / "configs" / "base.yaml")
    if base.data.source == "synthetic":  # as shipped; a fork's own data chooses its own
        assert "flip_up_down" in base.pipeline.transforms


def test_a_saved_device_layer_keeps_its_transforms():
    layer = augment.DeviceAugment(seed=3, transforms=["flip_up_down"])
    again = augment.DeviceAugment.from_config(layer.get_config())
    assert again.transforms == augment.Transforms(flip_up_down=True) and again.seed == 3


def test_per_example_augmentation_flips_about_half():
    image = np.zeros((8, 8, 3), np.uint8)
    image[:, :4] = 255
    flipped = [
        bool(augment.tf_augment_one(index, (tf.constant(image), 0), 0, ALL)[0].numpy()[4, 0, 0] == 0)
        for index in range(200)
    ]
    assert 60 < sum(flipped) < 140


def test_augmentation_draws_are_a_function_of_seed_and_index():
    images = tf.constant(np.random.default_rng(2).integers(0, 256, (8, 32, 16, 3), dtype=np.uint8))
    labels = tf.range(8)
    first = augment.tf_augment_batch(5, (images, labels), 1, ALL)[0].numpy()
    assert (first == augment.tf_augment_batch(5, (images, labels), 1, ALL)[0].numpy()).all()
    assert not (first == augment.tf_augment_batch(6, (images, labels), 1, ALL)[0].numpy()).all()
    assert not (first == augment.tf_augment_batch(5, (images, labels), 2, ALL)[0].numpy()).all()


def test_batched_augmentation_changes_images_but_keeps_labels(tiny_spec):
    knob = knobs("optimized", deterministic=True)
    images = np.stack([np.full((32, 32, 3), i, np.uint8) for i in range(8)])
    images[:, :, :16] = 0  # left half dark, so a left-right flip shows
    labels = np.arange(8)
    stacked = tf.stack([augment.add_mirror(tf.constant(image), 0)[0] for image in images])
    out, out_labels = augment.tf_augment_batch(0, (stacked, tf.constant(labels)), 0, ALL)
    assert (out_labels.numpy() == labels).all() and out.dtype == tf.uint8 and out.shape == images.shape
    assert not (out.numpy() == images).all()
    assert knob.augment == "batched"


def test_batched_augmentation_flips_about_half_left_right(tiny_spec):
    image = np.zeros((8, 8, 3), np.uint8)
    image[:, :4] = 255  # left half bright; a left-right flip makes it dark
    stacked = tf.stack([augment.add_mirror(tf.constant(image), 0)[0]] * 50)
    flipped = sum(
        int((augment.tf_augment_batch(index, (stacked, tf.zeros([50])), 0, ALL)[0].numpy()[:, 4, 0, 0] == 255).sum())
        for index in range(4)
    )
    assert 60 < flipped < 140


def test_the_optimized_pipeline_yields_plain_images_and_caches_mirrors(tiny_spec):
    knob = decided(tiny_spec, knobs("optimized", cache="memory"))
    train_mb = pipeline.cache_size_mb(knob, tiny_spec, tiny_spec.num_train)
    assert train_mb == 2 * pipeline.cache_size_mb(knob, tiny_spec, tiny_spec.num_train, training=False)
    assert "mirror -> cache" in pipeline.describe(knob, tiny_spec, tiny_spec.num_train, 8)
    images, _ = next(iter(build_pipeline(tiny_spec, knob, training=True, batch_size=8)))
    assert images.shape == (8, *tiny_spec.image_shape)
