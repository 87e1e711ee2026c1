"""The text models: a Transformer encoder for text classification that respects the padding (and segment)
mask (layers.py), registered by name with train/models.py's registry; the config names one under `model.name`.

- `text_small`: one narrow layer, the part `tiny` plays for images: on a machine without a GPU the
  input pipeline and the padding, not the model, set the pace (its speed: docs/figures.md).
- `text_transformer`: the full form for GPUs (4 layers of 256, 4 heads).

A builder's `input_shape` is a `TokenInput` (vocabulary size, longest sequence, packed or not),
from the built dataset's spec and the pipeline's knobs; its keyword parameters are what a config
may set under `model:`. `serving_model` puts the dataset's TextVectorization (same vocabulary)
in front of a trained model, so the exported model takes raw strings. Keras is imported only when a
model is built: loading a config that names one imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses

from train.models import register_model


@dataclasses.dataclass(frozen=True)
class TokenInput:
    """What a text model's inputs look like: passed as `input_shape` to a registered text builder."""

    vocab_size: int  # ids 0 (padding) and 1 (out of vocabulary) included
    max_length: int  # the longest row the pipeline hands out
    packed: bool = False  # rows hold several examples: segment ids and positions come with the token ids
    max_segments: int = 1  # packed: examples per row at most (the model's output has one row per segment)


@register_model("text_small")
def text_small(
    input_shape: TokenInput,
    num_classes: int,
    dim: int = 32,
    heads: int = 2,
    feed_forward: int = 64,
    depth: int = 1,
    dropout: float = 0.0,
):
    """One narrow encoder layer: on a 2-core CPU it keeps up with an optimized text pipeline, as a GPU
    keeps up with a real model, so the pipeline and the padding show in the throughput."""
    from train.workloads.text.layers import encoder

    return encoder(
        input_shape,
        num_classes,
        dim=dim,
        heads=heads,
        feed_forward=feed_forward,
        depth=depth,
        dropout=dropout,
        name="text_small",
    )


@register_model("text_transformer")
def text_transformer(
    input_shape: TokenInput,
    num_classes: int,
    dim: int = 256,
    heads: int = 4,
    feed_forward: int = 1024,
    depth: int = 4,
    dropout: float = 0.1,
):
    """A BERT-mini-sized encoder (4 layers of 256) for GPUs."""
    from train.workloads.text.layers import encoder

    return encoder(
        input_shape,
        num_classes,
        dim=dim,
        heads=heads,
        feed_forward=feed_forward,
        depth=depth,
        dropout=dropout,
        name="text_transformer",
    )


def serving_model(model, vocabulary: list[str], max_length: int):
    """`model` (trained on unpacked token ids) behind the dataset's TextVectorization: raw strings in, logits out.

    The layer is built from the saved vocabulary (train.workloads.text.vocabulary.load_vocabulary), so it maps words
    to the ids the model was trained on; texts longer than `max_length` tokens are cut, as when the dataset
    was built.
    """
    import keras
    from keras import ops

    from train.workloads.text import vocabulary as vocabulary_lib

    if isinstance(model.input, dict):
        raise ValueError("serving_model takes a model of unpacked rows; build one with TokenInput(packed=False)")
    texts = keras.Input(shape=(), dtype="string", name="text")
    vectorize = vocabulary_lib.vectorizer(vocabulary=vocabulary, ragged=False)
    token_ids = ops.cast(vectorize(texts)[:, :max_length], "int32")
    return keras.Model(texts, model(token_ids), name=f"{model.name}_serving")
