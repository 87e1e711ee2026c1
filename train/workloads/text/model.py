"""A Transformer encoder for text classification that respects the padding (and segment) mask.

token ids -> token embedding + learned positions -> N x [self-attention (padding mask; segment
mask when packed) -> feed-forward], pre-layer-norm with residuals -> masked mean pooling -> dense
logits (float32 under any precision policy). Padding never reaches a real token's attention or
the pooled vector, so a padded, a bucketed and a packed batch give the same logits per example.

Two registered forms (train/models.py's registry; the config names them under `model.name`):
- `text_small`: one narrow layer. On a 2-core CPU it runs about as fast as a GPU runs a real
  text model, so the input pipeline and the padding, not the model, set the pace, the part
  `tiny` plays for images.
- `text_transformer`: the full form for GPUs (4 layers of 256, 4 heads).

A builder's `input_shape` is a `TokenInput` (vocabulary size, longest sequence, packed or not),
from the built dataset's spec and the pipeline's knobs; its keyword parameters are what a config
may set under `model:`. `serving_model` puts the dataset's TextVectorization (same vocabulary)
in front of a trained model, so the exported model takes raw strings.
"""

from __future__ import annotations

import dataclasses

import keras
from keras import layers, ops

from train.models import register_model


@dataclasses.dataclass(frozen=True)
class TokenInput:
    """What a text model's inputs look like: passed as `input_shape` to a registered text builder."""

    vocab_size: int  # ids 0 (padding) and 1 (out of vocabulary) included
    max_length: int  # the longest row the pipeline hands out
    packed: bool = False  # rows hold several examples: segment ids and positions come with the token ids
    max_segments: int = 1  # packed: examples per row at most (the model's output has one row per segment)


@keras.saving.register_keras_serializable(package="train_text")
class TokenAndPosition(layers.Layer):
    """Token embedding plus a learned embedding of each token's position within its example."""

    def __init__(self, vocab_size: int, max_length: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.max_length, self.dim = vocab_size, max_length, dim
        self.tokens = layers.Embedding(vocab_size, dim, name="tokens")
        self.positions = layers.Embedding(max_length, dim, name="positions")

    def build(self, token_ids_shape, positions_shape=None):
        self.tokens.build(token_ids_shape)
        self.positions.build(token_ids_shape)

    def call(self, token_ids, positions=None):
        if positions is None:
            positions = ops.arange(ops.shape(token_ids)[1])[None, :]
        return self.tokens(token_ids) + self.positions(positions)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "max_length": self.max_length, "dim": self.dim}


@keras.saving.register_keras_serializable(package="train_text")
class EncoderBlock(layers.Layer):
    """Pre-layer-norm self-attention and feed-forward, each with a residual."""

    def __init__(self, dim: int, heads: int, feed_forward: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.heads, self.feed_forward, self.dropout = dim, heads, feed_forward, dropout
        self.attention_norm = layers.LayerNormalization(epsilon=1e-6)
        self.attention = layers.MultiHeadAttention(heads, dim // heads, dropout=dropout)
        self.dense_norm = layers.LayerNormalization(epsilon=1e-6)
        self.expand = layers.Dense(feed_forward, activation="gelu")
        self.project = layers.Dense(dim)
        self.drop = layers.Dropout(dropout)

    def build(self, x_shape, attention_mask_shape=None):
        self.attention_norm.build(x_shape)
        self.attention.build(x_shape, x_shape)
        self.dense_norm.build(x_shape)
        self.expand.build(x_shape)
        self.project.build((*x_shape[:-1], self.feed_forward))

    def call(self, x, attention_mask, training=False):
        normed = self.attention_norm(x)
        x = x + self.drop(self.attention(normed, normed, attention_mask=attention_mask, training=training))
        return x + self.drop(self.project(self.expand(self.dense_norm(x))), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "dim": self.dim,
            "heads": self.heads,
            "feed_forward": self.feed_forward,
            "dropout": self.dropout,
        }


def attention_mask(token_ids, segment_ids=None):
    """[B, L, L] booleans: query i may attend to key j when both are real tokens of the same example."""
    if segment_ids is None:
        real = ops.not_equal(token_ids, 0)
        return ops.logical_and(real[:, :, None], real[:, None, :])
    same = ops.equal(segment_ids[:, :, None], segment_ids[:, None, :])
    return ops.logical_and(same, ops.greater(segment_ids, 0)[:, None, :])


def masked_mean(x, token_ids):
    """The mean of the real (non-padding) positions: [B, L, D] -> [B, D]."""
    weights = ops.cast(ops.not_equal(token_ids, 0), x.dtype)[:, :, None]
    return ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)


def segment_mean(x, segment_ids, max_segments: int):
    """The mean of each example's positions in packed rows: [B, L, D] -> [B, max_segments, D]."""
    numbers = ops.arange(1, max_segments + 1, dtype=segment_ids.dtype)
    members = ops.cast(ops.equal(segment_ids[:, None, :], numbers[None, :, None]), x.dtype)  # [B, S, L]
    return ops.matmul(members, x) / ops.maximum(ops.sum(members, axis=2, keepdims=True), 1.0)


def encoder(
    shape: TokenInput, num_classes: int, *, dim: int, heads: int, feed_forward: int, depth: int, dropout: float, name
):
    """The classifier for unpacked ([B, L] token ids -> [B, C]) or packed rows (-> [B, S, C] per segment)."""
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    inputs = {"token_ids": token_ids}
    segment_ids = positions = None
    if shape.packed:
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        positions = keras.Input(shape=(None,), dtype="int32", name="positions")
        inputs.update(segment_ids=segment_ids, positions=positions)
    x = TokenAndPosition(shape.vocab_size, shape.max_length, dim, name="embed")(token_ids, positions)
    mask = attention_mask(token_ids, segment_ids)
    for index in range(depth):
        x = EncoderBlock(dim, heads, feed_forward, dropout, name=f"block_{index}")(x, mask)
    x = layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
    x = ops.cast(x, "float32")  # pooling sums up to max_length vectors: in float32 under a mixed policy
    pooled = segment_mean(x, segment_ids, shape.max_segments) if shape.packed else masked_mean(x, token_ids)
    if dropout:
        pooled = layers.Dropout(dropout)(pooled)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(pooled)
    return keras.Model(inputs if shape.packed else token_ids, logits, name=name)


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


def serving_model(model: keras.Model, vocabulary: list[str], max_length: int) -> keras.Model:
    """`model` (trained on unpacked token ids) behind the dataset's TextVectorization: raw strings in, logits out.

    The layer is built from the saved vocabulary (train.workloads.text.vocabulary.load_vocabulary), so it maps words
    to the ids the model was trained on; texts longer than `max_length` tokens are cut, as when the dataset
    was built.
    """
    from train.workloads.text import vocabulary as vocabulary_lib

    if isinstance(model.input, dict):
        raise ValueError("serving_model takes a model of unpacked rows; build one with TokenInput(packed=False)")
    texts = keras.Input(shape=(), dtype="string", name="text")
    vectorize = vocabulary_lib.vectorizer(vocabulary=vocabulary, ragged=False)
    token_ids = ops.cast(vectorize(texts)[:, :max_length], "int32")
    return keras.Model(texts, model(token_ids), name=f"{model.name}_serving")
