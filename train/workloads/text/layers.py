"""The text encoder's Keras layers and its graph: imported when a text model is built or loaded (model.py's
builders import it), never when a config is loaded.

token ids -> token embedding + learned positions -> N x [self-attention (padding mask; segment
mask when packed) -> feed-forward], pre-layer-norm with residuals -> masked mean pooling -> dense
logits (float32 under any precision policy). Padding never reaches a real token's attention or
the pooled vector, so a padded, a bucketed and a packed batch give the same logits per example.
The layers are registered with Keras (package train_text), so a saved model loads once this
module is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras
from keras import layers, ops

if TYPE_CHECKING:
    from train.workloads.text.model import TokenInput


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
