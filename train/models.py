"""Models by name, and what trains them: loss, optimizer, metrics (README and docs/make-it-yours.md).

Add a model with `@register_model("name")`. Change the loss, optimizer or metrics in the
three functions below: both training loops (Keras `fit` and the multi-worker custom loop)
use them and nothing else.

A model builder takes `input_shape` and `num_classes` (both from the dataset's metadata)
plus keyword parameters with defaults; those parameters are what a config may set under
`model:`, and their types are checked from the defaults before anything is built.
Builders take uint8 images and scale them inside the model, so the input pipeline ships
compact uint8 batches to the device.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from train.core.errors import UserError, did_you_mean

MODELS: dict[str, Callable] = {}

# Keras' default (0.99) lets the moving statistics lag for hundreds of steps: with a few
# dozen steps per epoch, validation then runs on stale statistics and looks broken.
BN_MOMENTUM = 0.9


def register_model(name: str) -> Callable[[Callable], Callable]:
    def decorator(builder: Callable) -> Callable:
        MODELS[name] = builder
        return builder

    return decorator


def _parameters(name: str) -> dict[str, inspect.Parameter]:
    signature = inspect.signature(MODELS[name])
    return {k: p for k, p in signature.parameters.items() if k not in ("input_shape", "num_classes")}


def resolve_params(name: str, params: dict, source: str = "config") -> dict:
    """The builder's defaults updated with `params`; unknown or mistyped parameters are errors."""
    if name not in MODELS:
        raise UserError(
            f"{source}: unknown model '{name}'.{did_you_mean(name, MODELS)} Registered models: "
            f"{', '.join(sorted(MODELS))}. Register a new one with @register_model in train/models.py."
        )
    accepted = _parameters(name)
    resolved = {k: p.default for k, p in accepted.items()}
    for key, value in params.items():
        if key not in accepted:
            raise UserError(
                f"{source}: model '{name}' has no parameter 'model.{key}'.{did_you_mean(key, accepted)} "
                f"Its parameters: {', '.join(accepted) or 'none'}."
            )
        default = accepted[key].default
        if (
            default is not None
            and not isinstance(value, type(default))
            and not (isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool))
        ):
            raise UserError(
                f"{source}: 'model.{key}' must be {type(default).__name__} (default {default!r}), got {value!r}."
            )
        resolved[key] = value
    return resolved


def loss():
    """The training loss. Models end in float32 logits (even under mixed precision)."""
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def optimizer(learning_rate):
    """The optimizer, given the (scheduled) learning rate that the run set-up derives."""
    import keras

    return keras.optimizers.Adam(learning_rate)


def metrics() -> list:
    """Metrics reported besides the loss, by name in history, TensorBoard and summary.json."""
    import keras

    return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, params: dict):
    return MODELS[name](input_shape=input_shape, num_classes=num_classes, **resolve_params(name, params))


@register_model("tiny")
def tiny(input_shape, num_classes, width: int = 16):
    """Three strided convolutions and a global max-pool: fast enough on a CPU that the input
    pipeline, not the model, limits throughput, as it does on an accelerator. That is why
    `make compare` uses it on a machine without a GPU. Its speed depends on the CPU, several-fold,
    and it still learns the built-in dataset: docs/figures.md, "The tiny model's speed".
    """
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")
    x = layers.Rescaling(1.0 / 255)(inputs)
    for multiple in (1, 2, 4):
        x = layers.Conv2D(width * multiple, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalMaxPooling2D()(x)
    outputs = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="tiny")


@register_model("resnet")
def resnet(input_shape, num_classes, width: int = 32, depth: int = 2, dropout: float = 0.0):
    """A small ResNet: a stem, then three stages of `depth` residual blocks (width, 2x, 4x)."""
    import keras
    from keras import layers

    def block(x, filters: int, stride: int):
        shortcut = x
        y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.BatchNormalization(momentum=BN_MOMENTUM)(y)
        y = layers.ReLU()(y)
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = layers.BatchNormalization(momentum=BN_MOMENTUM)(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
            shortcut = layers.BatchNormalization(momentum=BN_MOMENTUM)(shortcut)
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Conv2D(width, 3, strides=2, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    x = layers.ReLU()(x)
    for stage, filters in enumerate((width, 2 * width, 4 * width)):
        for index in range(depth):
            x = block(x, filters, stride=2 if stage > 0 and index == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    if dropout:
        x = layers.Dropout(dropout)(x)
    outputs = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=f"resnet_w{width}_d{depth}")


def _application(name: str, constructor_name: str, minimum: int, input_shape, num_classes, weights, dropout, **kwargs):
    """A Keras Applications backbone with a new classification head.

    The backbones scale [0, 255] inputs themselves, so the uint8 batch is only cast.
    `weights="imagenet"` downloads pretrained weights (needs the internet and 3 channels).
    """
    import keras
    from keras import layers

    height, width = input_shape[:2]
    if height < minimum or width < minimum:
        raise UserError(
            f"model '{name}' needs images of at least {minimum}x{minimum}, and this dataset's are "
            f"{height}x{width}. Set data.image_size to {minimum} or more (then build the data again)."
        )
    backbone = getattr(keras.applications, constructor_name)(
        input_shape=tuple(input_shape), include_top=False, weights=weights, pooling="avg", **kwargs
    )
    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")
    x = layers.Rescaling(1.0)(inputs)  # a cast to the compute dtype, values stay 0..255
    x = backbone(x)
    if dropout:
        x = layers.Dropout(dropout)(x)
    outputs = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


@register_model("mobilenet_v3_small")
def mobilenet_v3_small(input_shape, num_classes, alpha: float = 1.0, dropout: float = 0.2, weights: str | None = None):
    """MobileNetV3-Small from Keras Applications (images of 32x32 or more)."""
    return _application(
        "mobilenet_v3_small", "MobileNetV3Small", 32, input_shape, num_classes, weights, dropout, alpha=alpha
    )


@register_model("efficientnet_b0")
def efficientnet_b0(input_shape, num_classes, dropout: float = 0.2, weights: str | None = None):
    """EfficientNet-B0 from Keras Applications (images of 32x32 or more)."""
    return _application("efficientnet_b0", "EfficientNetB0", 32, input_shape, num_classes, weights, dropout)
