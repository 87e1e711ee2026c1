"""Where datasets come from: the built-in sources, and the place to add your own.

`data.source` names a source as `scheme` or `scheme:argument`: `synthetic` (the built-in shapes
dataset), `imagefolder:PATH` (PATH/<class>/*.jpg) and `tfds:NAME` (any tensorflow-datasets image
classification dataset) are registered below with `register_source`. Each ends as sharded
TFRecords in the tensorflow-datasets layout (train/shards/): `prepare` builds a dataset once,
`locate` finds it for training. Add a source the same way: a function that says where its built
dataset lives and one that writes it there (train/shards/convert.py writes the records).
"""

from __future__ import annotations

import os
from pathlib import Path

from train.core.errors import UserError, did_you_mean
from train.shards.catalog import SOURCES, locate, prepare, register_source, remove_incomplete
from train.shards.spec import DatasetSpec

__all__ = ["SOURCES", "DatasetSpec", "locate", "prepare", "register_source", "remove_incomplete"]


def _synthetic_config(data):
    from data import synthetic_shapes  # the project's data/ package, installed with it

    return synthetic_shapes.config_for(data.image_size, data.num_train, data.num_val, data.num_shards)


def _synthetic_dir(data, argument: str) -> Path:
    return Path(data.data_dir) / "synthetic_shapes" / _synthetic_config(data).name / "1.0.0"


def _synthetic_prepare(data, argument: str, target: Path) -> None:
    import tensorflow_datasets as tfds

    from data import synthetic_shapes

    builder = synthetic_shapes.Builder(config=_synthetic_config(data), data_dir=data.data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=data.num_shards))


register_source(
    "synthetic",
    describe="synthetic (the built-in shapes dataset)",
    dataset_dir=_synthetic_dir,
    prepare=_synthetic_prepare,
)


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
SPLIT_FOLDERS = ("validation", "val", "test")


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def _class_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def imagefolder_listing(argument: str, val_fraction: float) -> dict:
    """Classes and (file, label) lists per split of an image folder, or a UserError saying what is wrong.

    Layout: ROOT/<class>/*.jpg, the class being the folder name. With ROOT/train/<class>/ and
    ROOT/val/<class>/ (or validation/, test/) the splits are taken as given; otherwise a
    fixed `data.val_fraction` of each class (chosen by a hash of the file name) is held out.
    """
    if not argument:
        raise UserError(
            "data.source 'imagefolder:' needs a folder, e.g. imagefolder:my_images (with my_images/<class>/*.jpg)."
        )
    root = Path(argument).expanduser()
    if not root.is_dir():
        raise UserError(f"data.source imagefolder:{argument}: the folder {root} does not exist.")
    split_roots = {"train": root / "train"}
    for name in SPLIT_FOLDERS:
        if (root / name).is_dir():
            split_roots["validation"] = root / name
            break
    given_splits = split_roots["train"].is_dir() and "validation" in split_roots
    class_root = split_roots["train"] if given_splits else root
    classes = [folder.name for folder in _class_folders(class_root) if _images_in(folder)]
    if not classes:
        loose = _images_in(root)
        if loose:
            raise UserError(
                f"data.source imagefolder:{argument}: {root} has {len(loose)} images but no class sub-folders. "
                f"Put each class in its own folder: {root}/<class name>/image.jpg (the folder name is the label)."
            )
        raise UserError(
            f"data.source imagefolder:{argument}: {root} holds no images "
            f"({', '.join(sorted(IMAGE_SUFFIXES))}) in class sub-folders."
        )
    if len(classes) < 2:
        raise UserError(
            f"data.source imagefolder:{argument}: only one class ({classes[0]}) was found; a classifier "
            "needs at least two class sub-folders."
        )
    label = {name: index for index, name in enumerate(classes)}
    splits: dict[str, list[tuple[str, int]]] = {"train": [], "validation": []}
    if given_splits:
        for split, split_root in split_roots.items():
            for name in classes:
                splits[split] += [(str(p), label[name]) for p in _images_in(split_root / name)]
    else:
        import hashlib

        for name in classes:
            for path in _images_in(root / name):
                digest = hashlib.sha1(str(path.relative_to(root)).encode()).digest()
                split = "validation" if digest[0] / 256 < val_fraction else "train"
                splits[split].append((str(path), label[name]))
    for split, paths in splits.items():
        if not paths:
            raise UserError(
                f"data.source imagefolder:{argument}: the {split} split has no images; add images "
                "or change data.val_fraction."
            )
    return {"root": root, "classes": classes, "splits": splits}


def _imagefolder_dir(data, argument: str) -> Path:
    import hashlib

    listing = imagefolder_listing(argument, data.val_fraction)
    fingerprint = hashlib.sha1()
    for split, paths in sorted(listing["splits"].items()):
        for path, label in paths:
            stat = os.stat(path)
            fingerprint.update(f"{split}|{path}|{label}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    name = f"{listing['root'].name or 'images'}-{fingerprint.hexdigest()[:10]}"
    return Path(data.data_dir) / "imagefolder" / name / f"{data.image_size}px_{data.num_shards}shards" / "1.0.0"


def _imagefolder_prepare(data, argument: str, target: Path) -> None:
    from train.shards import convert

    listing = imagefolder_listing(argument, data.val_fraction)
    # Prefixed, so a folder named like a TFDS catalog dataset (mnist, ...) is never taken for it.
    writer = convert.DatasetWriter(target, "imagefolder_" + _identifier(listing["root"].name or "images"))
    unreadable = []
    for split, paths in listing["splits"].items():
        _, problems = convert.convert_files(writer, split, paths, data.image_size, data.num_shards)
        unreadable += problems
    if unreadable:
        print(f"Skipped {len(unreadable)} unreadable image(s), e.g. {unreadable[0]}", flush=True)
    writer.finish(listing["classes"], data.image_size, f"Converted from the image folder {listing['root']}.")


def _identifier(text: str) -> str:
    import re

    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_") or "dataset"


def _tfds_name(argument: str) -> str:
    import tensorflow_datasets as tfds

    if not argument:
        raise UserError("data.source 'tfds:' needs a dataset name, e.g. tfds:cifar10.")
    try:
        tfds.builder_cls(argument.split("/")[0])
    except tfds.core.registered.DatasetNotFoundError:
        raise UserError(
            f"data.source tfds:{argument}: tensorflow-datasets has no dataset '{argument}'."
            f"{did_you_mean(argument, tfds.list_builders())} See https://www.tensorflow.org/datasets/catalog."
        ) from None
    return argument


def _tfds_dir(data, argument: str) -> Path:
    name = _tfds_name(argument).replace("/", "_").replace(":", "_")
    return Path(data.data_dir) / "tfds" / name / f"{data.image_size}px_{data.num_shards}shards" / "1.0.0"


def _tfds_prepare(data, argument: str, target: Path) -> None:
    import tensorflow_datasets as tfds

    from train.shards import convert

    builder = tfds.builder(_tfds_name(argument), data_dir=str(Path(data.data_dir) / "tfds-downloads"))
    builder.download_and_prepare()
    info = builder.info
    image_key, label_key = info.supervised_keys or ("image", "label")
    available = list(info.splits.keys())
    val_split = next((s for s in ("validation", "test") if s in available), "validation" if not available else None)
    if val_split is None:
        raise UserError(f"data.source tfds:{argument} has no validation or test split (it has: {available}).")
    writer = convert.DatasetWriter(target, "tfds_" + _identifier(argument))
    for split, source_split in (("train", "train"), ("validation", val_split)):
        examples = ((ex[image_key], ex[label_key]) for ex in tfds.as_numpy(builder.as_dataset(split=source_split)))
        total = info.splits[source_split].num_examples if source_split in available else None
        convert.convert_examples(writer, split, examples, data.image_size, data.num_shards, total)
    names = info.features[label_key].names
    writer.finish(names, data.image_size, f"Converted from tensorflow-datasets '{argument}'.")


register_source(
    "imagefolder",
    describe="imagefolder:PATH (PATH/<class>/*.jpg)",
    dataset_dir=_imagefolder_dir,
    prepare=_imagefolder_prepare,
)
register_source(
    "tfds",
    describe="tfds:NAME (any tensorflow-datasets image classification dataset)",
    dataset_dir=_tfds_dir,
    prepare=_tfds_prepare,
)
