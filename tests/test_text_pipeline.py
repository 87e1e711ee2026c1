"""The text pipeline builder: every preset and batching mode yields the same texts; buckets give few shapes
and little padding; packing keeps each text whole; the naive preset really has no prefetch."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from tests.text_helpers import all_texts, build, preset_knobs, texts_of, tiny_text_spec  # noqa: F401
from train.workloads.text import buckets, figures, packing, pipeline

BATCHINGS = ("pad_max", "pad_batch", "bucket", "pack")


def test_the_naive_and_optimized_presets_read_the_same_texts(tiny_text_spec):  # noqa: F811
    spec = tiny_text_spec
    naive = all_texts(build(spec, preset_knobs("naive"), training=False))
    assert sum(naive.values()) == spec.num_val
    for batching in BATCHINGS:
        optimized = all_texts(build(spec, preset_knobs("optimized", batching=batching), training=False))
        assert optimized == naive, batching
    python_bucketed = all_texts(build(spec, preset_knobs("naive", batching="bucket"), training=False))
    assert python_bucketed == naive


def test_one_training_epoch_of_the_naive_preset_holds_every_text(tiny_text_spec):  # noqa: F811
    spec = tiny_text_spec
    knobs = preset_knobs("naive", batch_size=16)
    seen = all_texts(build(spec, knobs, training=True), batches=spec.num_train // 16)
    assert sum(seen.values()) == spec.num_train
    reference = all_texts(build(spec, preset_knobs("optimized"), training=False, batch_size=16), None)
    assert set(seen) != set(reference)  # training texts are not the validation texts


def test_shuffling_changes_the_order_and_each_epoch_is_reshuffled(tiny_text_spec):  # noqa: F811
    spec = tiny_text_spec
    knobs = preset_knobs("optimized", batching="pad_batch", batch_size=spec.num_train, deterministic=True)
    first, second = (texts_of(batch) for batch in build(spec, knobs, training=True).take(2))
    resolved, _ = pipeline.resolve(knobs, spec)
    in_order = texts_of(next(iter(pipeline.build(spec.train_files, spec, resolved, training=False))))
    assert Counter(first) == Counter(second) == Counter(in_order) and first != second
    unshuffled = dataclasses.replace(knobs, shuffle_buffer=0, shuffle_files=False)
    assert texts_of(next(iter(build(spec, unshuffled, training=True)))) == in_order != first


def test_buckets_give_few_shapes_and_little_padding(tiny_text_spec):  # noqa: F811
    spec = tiny_text_spec
    knobs, reasons = pipeline.resolve(preset_knobs("optimized", token_budget=2048), spec)
    assert "text.pipeline.bucket_lengths" in reasons
    sizes = pipeline.bucket_sizes(knobs)
    allowed = set(zip(sizes, knobs.bucket_lengths))
    seen = figures.of_batches(build(spec, knobs, training=True).take(60))
    assert set(seen.shapes) <= allowed and seen.distinct_shapes >= 3
    assert seen.padding_share < 0.25
    padded = figures.of_batches(build(spec, preset_knobs("naive"), training=True).take(5))
    assert padded.padding_share > 0.55 and padded.distinct_shapes == 1
    assert all(rows * length <= 2048 for rows, length in allowed)


def test_pad_batch_makes_a_new_shape_almost_every_batch(tiny_text_spec):  # noqa: F811
    knobs = preset_knobs("optimized", batching="pad_batch", batch_size=8)
    seen = figures.of_batches(build(tiny_text_spec, knobs, training=True).take(20))
    assert seen.distinct_shapes >= 12


def test_packing_keeps_each_text_whole_with_segments_and_positions():
    ids = tf.ragged.constant([[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15], [16, 17, 18, 19, 20, 21, 22, 23]])
    inputs, labels, weights = packing.pack_window(tf.cast(ids, tf.int32), tf.constant([0, 1, 2, 3, 4]), 8, 2)
    tokens, segments, positions = (inputs[key].numpy() for key in ("token_ids", "segment_ids", "positions"))
    assert tokens.shape[1] == 8 and np.all(segments.max(axis=1) <= 2)
    rebuilt = Counter(texts_of((inputs, labels, weights)))
    assert rebuilt == Counter((i, tuple(row)) for i, row in enumerate(ids.to_list()))
    for row in range(tokens.shape[0]):
        for segment in range(1, segments[row].max() + 1):
            assert positions[row][segments[row] == segment].tolist() == list(range((segments[row] == segment).sum()))
    assert np.all(tokens[segments == 0] == 0) and weights.numpy().sum() == 5


def test_packed_batches_have_one_shape_and_almost_no_padding(tiny_text_spec):  # noqa: F811
    knobs = preset_knobs("optimized", batching="pack", token_budget=2048, pack_window=64)
    seen = figures.of_batches(build(tiny_text_spec, knobs, training=True).take(20))
    assert seen.shapes.keys() == {(4, 512)} and seen.padding_share < 0.1 and seen.examples > 20


def test_the_naive_preset_has_no_prefetch_and_python_in_the_loop(tiny_text_spec):  # noqa: F811
    naive = build(tiny_text_spec, preset_knobs("naive"), training=True)
    assert naive.options().experimental_optimization.inject_prefetch is False
    graph = naive._as_serialized_graph().numpy()  # the dataset's ops, as the runtime sees them
    assert b"PrefetchDataset" not in graph and b"PyFunc" in graph
    optimized = build(tiny_text_spec, preset_knobs("optimized"), training=True)
    assert optimized.options().experimental_optimization.inject_prefetch is True
    graph = optimized._as_serialized_graph().numpy()
    assert b"PrefetchDataset" in graph and b"PyFunc" not in graph and b"ParallelMapDataset" in graph
    knobs, _ = pipeline.resolve(preset_knobs("naive"), tiny_text_spec)
    assert pipeline.describe(knobs, tiny_text_spec).startswith("python generator")
    assert pipeline.describe(knobs, tiny_text_spec).endswith("padded_batch(32, to 512) -> no prefetch")


def test_undecided_knobs_are_refused():
    with pytest.raises(ValueError, match=r"text\.pipeline\.bucket_lengths.*resolve"):
        pipeline.build([], None, preset_knobs("optimized"), training=True)


def test_steps_per_epoch_matches_the_batches_of_one_pass(tiny_text_spec):  # noqa: F811
    spec = tiny_text_spec
    knobs, _ = pipeline.resolve(preset_knobs("optimized", token_budget=2048, bucket_lengths=[128, 256, 512]), spec)
    steps = pipeline.steps_per_epoch(knobs, spec)
    texts = sum(figures.of_batches(build(spec, knobs, training=True).take(steps)).examples for _ in range(1))
    assert abs(texts - spec.num_train) <= max(pipeline.bucket_sizes(knobs))
    naive, _ = pipeline.resolve(preset_knobs("naive", batch_size=16), spec)
    assert pipeline.steps_per_epoch(naive, spec) == spec.num_train // 16


def brute_force(histogram, count, multiple, max_length):
    candidates = sorted(set(range(multiple, max_length, multiple)) | {max_length})
    best = None
    for chosen in itertools.combinations(candidates[:-1], count - 1):
        lengths = [*chosen, max_length]
        share = buckets.padding_share(histogram, lengths)
        best = share if best is None else min(best, share)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_bucket_lengths_pad_the_least_of_all_choices(seed):
    rng = np.random.default_rng(seed)
    histogram = np.bincount(rng.integers(1, 49, 60), minlength=49)
    top = int(np.flatnonzero(histogram).max())
    top = -(-top // 4) * 4
    for count in (1, 2, 3):
        lengths, _ = buckets.best_lengths(histogram[: top + 1], count, 4, top)
        assert len(lengths) <= count and lengths[-1] == top
        assert buckets.padding_share(histogram, lengths) == pytest.approx(brute_force(histogram, count, 4, top))


def test_chosen_buckets_meet_the_padding_target_with_the_fewest_shapes():
    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(128), 0.7, 5000).round(), 8, 512).astype(int)
    histogram = np.bincount(lengths, minlength=513)
    assert buckets.padding_share(histogram, [512]) == pytest.approx(1 - lengths.sum() / (512 * 5000))
    chosen = buckets.choose_lengths(histogram, 0.12, 12, 8, 512)
    assert buckets.padding_share(histogram, chosen) <= 0.12 and all(n % 8 == 0 for n in chosen)
    fewer, _ = buckets.best_lengths(histogram, len(chosen) - 1, 8, 512)
    assert buckets.padding_share(histogram, fewer) > 0.12
    assert buckets.batch_sizes([64, 100, 512, 4096], 8192, 8) == [128, 80, 16, 2]


def test_batch_figures_count_real_tokens_slots_and_shapes():
    unpacked = (np.array([[3, 4, 0, 0], [5, 0, 0, 0]]), np.array([0, 1]))
    packed = (
        {"token_ids": np.array([[3, 4, 5, 0]]), "segment_ids": np.array([[1, 1, 2, 0]])},
        None,
        np.array([[1, 1]]),
    )
    seen = figures.of_batches([unpacked, unpacked, packed])
    assert (seen.real_tokens, seen.slots, seen.examples) == (9, 20, 6)
    assert seen.padding_share == pytest.approx(11 / 20) and seen.distinct_shapes == 2
    assert seen.rates(2.0)["real_tokens_per_s"] == 4.5
    assert seen.as_dict()["shapes"] == {"1x4": 1, "2x4": 2}
