"""Synthetic shapes: a learnable image-classification dataset generated locally.

Each example is one filled shape (the label) drawn at a random size, position and
colour on a noisy background, stored as a JPEG so that decoding costs what it costs
with real photos. Nothing is downloaded: `_generate_examples` draws every image.

Build it with `make data` (or `tfds build data/synthetic_shapes`); the size of the
dataset is a builder config, so different sizes live side by side under data_dir.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "diamond", "plus", "ring")


@dataclasses.dataclass(eq=False)
class SyntheticShapesConfig(tfds.core.BuilderConfig):
    image_size: int = 64
    num_train: int = 10_000
    num_val: int = 2_000
    jpeg_quality: int = 90
    seed: int = 0


def _make_config(image_size: int, num_train: int, num_val: int, num_shards: int) -> SyntheticShapesConfig:
    return SyntheticShapesConfig(
        name=f"{image_size}px_{num_train}train_{num_val}val_{num_shards}shards",
        description=f"{num_train}+{num_val} JPEG images of {image_size}x{image_size}, {num_shards} shards per split",
        image_size=image_size,
        num_train=num_train,
        num_val=num_val,
    )


DEFAULT_CONFIG = _make_config(64, 10_000, 2_000, 8)


def config_for(image_size: int, num_train: int, num_val: int, num_shards: int) -> SyntheticShapesConfig:
    """A builder config whose name records every parameter, so sizes never collide on disk."""
    config = _make_config(image_size, num_train, num_val, num_shards)
    # TFDS requires the very object listed in BUILDER_CONFIGS when the name matches one.
    return DEFAULT_CONFIG if config.name == DEFAULT_CONFIG.name else config


def draw_example(rng: np.random.Generator, size: int) -> tuple[np.ndarray, int]:
    """Draw one image (uint8 HxWx3) and its label from `rng`."""
    label = int(rng.integers(len(SHAPES)))
    background = rng.integers(0, 256, 3)
    noise = rng.normal(0.0, 18.0, (size, size, 3))
    canvas = np.clip(background * 0.5 + 40 + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)

    colour = tuple(int(c) for c in (rng.integers(0, 256, 3) // 2 + 128))
    half = rng.uniform(0.18, 0.34) * size
    cx, cy = rng.uniform(half + 1, size - half - 1, 2)
    box = (cx - half, cy - half, cx + half, cy + half)
    shape = SHAPES[label]
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        tip, base = (cy - half, cy + half) if rng.random() < 0.5 else (cy + half, cy - half)
        draw.polygon([(cx, tip), (cx - half, base), (cx + half, base)], fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, cy - half), (cx + half, cy), (cx, cy + half), (cx - half, cy)], fill=colour)
    elif shape == "plus":
        arm = half / 3
        draw.rectangle((cx - half, cy - arm, cx + half, cy + arm), fill=colour)
        draw.rectangle((cx - arm, cy - half, cx + arm, cy + half), fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=max(2, int(half / 3)))
    return np.asarray(image), label


def encode_jpeg(pixels: np.ndarray, quality: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


class Builder(tfds.core.GeneratorBasedBuilder):
    """Synthetic shapes, drawn locally; the label is the shape."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    BUILDER_CONFIGS = [DEFAULT_CONFIG]

    def _info(self) -> tfds.core.DatasetInfo:
        size = self.builder_config.image_size
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(size, size, 3), encoding_format="jpeg"),
                    "label": tfds.features.ClassLabel(names=SHAPES),
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        config = self.builder_config
        return {
            "train": self._generate_examples("train", config.num_train),
            "validation": self._generate_examples("validation", config.num_val),
        }

    def _generate_examples(self, split: str, count: int):
        config = self.builder_config
        split_id = 0 if split == "train" else 1
        for index in range(count):
            rng = np.random.default_rng([config.seed, split_id, index])
            pixels, label = draw_example(rng, config.image_size)
            yield index, {"image": encode_jpeg(pixels, config.jpeg_quality), "label": label}
