"""Building a text dataset once: source -> raw shards -> vocabulary -> token-id shards -> spec.

`text.data.source` names the source: `synthetic` (the built-in corpus, corpus.py), `csv:PATH`,
`jsonl:PATH` or `textfolder:PATH` (user_text.py). The build

1. writes the checked texts as raw JSONL shards (what the naive pipeline reads);
2. adapts Keras `TextVectorization` on the training split only and saves its vocabulary;
3. tokenizes every text once with that layer, cuts it at `max_length` tokens, and writes the token
   ids and labels to TFRecord shards (what the optimized pipeline reads);
4. writes the spec: vocabulary, counts, the training split's length histogram, what was cut or skipped.

Everything goes into a `partial.*` folder beside the target, renamed into place when complete: an
interrupted build leaves no dataset that looks finished, and a rerun starts it again. `prepare`
builds unless the dataset is there; `locate` finds it or names the command that builds it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from train.core.errors import UserError, did_you_mean
from train.workloads.text import raw_shards, token_records, user_text, vocabulary
from train.workloads.text import spec as spec_lib
from train.workloads.text.corpus import Corpus, CorpusShape
from train.workloads.text.settings import TextDataConfig

KINDS = {
    "synthetic": "synthetic (the built-in corpus)",
    "csv": "csv:PATH (a header row with text and label columns)",
    "jsonl": "jsonl:PATH (one JSON object per line with text and label keys)",
    "textfolder": "textfolder:PATH (PATH/<class>/*.txt)",
}
LAYOUT = "v1"  # part of the folder name: a change of what is written gets a new folder
BATCH = 1024  # texts tokenized per call of the layer


def _kind(data: TextDataConfig) -> tuple[str, str]:
    kind, _, argument = data.source.partition(":")
    if kind not in KINDS:
        raise UserError(
            f"Unknown text.data.source '{data.source}'.{did_you_mean(kind, KINDS)} Known sources: "
            f"{'; '.join(KINDS.values())}."
        )
    if kind != "synthetic" and not argument:
        raise UserError(f"text.data.source '{kind}:' needs a path, e.g. {KINDS[kind].split(' ')[0]}.")
    return kind, argument


def _fingerprint(kind: str, argument: str, data: TextDataConfig) -> str:
    """What the built dataset depends on: the input files (path, size, time) and the knobs that change it."""
    digest = hashlib.sha1()
    path = Path(argument).expanduser()
    paths = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    for item in paths:
        stat = item.stat() if item.exists() else None
        digest.update(f"{item}|{stat and stat.st_size}|{stat and stat.st_mtime_ns}\n".encode())
    knobs = (data.text_key, data.label_key, data.val_fraction, data.bad_rows, data.seed)
    digest.update(repr(knobs).encode())
    return digest.hexdigest()[:10]


def dataset_dir(data: TextDataConfig) -> Path:
    kind, argument = _kind(data)
    shape = f"{data.max_tokens}vocab_{data.max_length}len_{data.num_shards}shards"
    if kind == "synthetic":
        name = f"{data.num_train}train_{data.num_val}val_seed{data.seed}"
        return Path(data.data_dir) / "text" / "synthetic" / name / shape / LAYOUT
    stem = Path(argument.rstrip("/")).expanduser().name or "text"
    name = f"{stem}-{_fingerprint(kind, argument, data)}"
    return Path(data.data_dir) / "text" / kind / name / shape / LAYOUT


def _splits(kind: str, argument: str, data: TextDataConfig):
    """(class names, {split: examples}, skipped rows) of the source."""
    if kind == "synthetic":
        corpus = Corpus(CorpusShape(), seed=data.seed)  # the same corpus at any max_length: the build cuts it
        counts = {"train": data.num_train, "validation": data.num_val}
        return corpus.class_names, {split: corpus.examples(split, n) for split, n in counts.items()}, [], counts
    collection = user_text.read_source(kind, argument, data)
    counts = {split: len(rows) for split, rows in collection.splits.items()}
    return collection.class_names, collection.splits, collection.skipped, counts


def _tokenize_shard(layer, path: str, max_length: int) -> tuple[list[bytes], np.ndarray, int, int]:
    """(records, lengths after the cut, texts cut, out-of-vocabulary tokens) of one raw shard."""
    rows = list(raw_shards.read_shard(path))
    records, lengths, cut, unknown = [], [], 0, 0
    for start in range(0, len(rows), BATCH):
        chunk = rows[start : start + BATCH]
        ragged = layer([text for text, _ in chunk])
        values, splits = ragged.flat_values.numpy(), ragged.row_splits.numpy()
        for index, (_, label) in enumerate(chunk):
            ids = values[splits[index] : splits[index + 1]]
            cut += len(ids) > max_length
            ids = ids[:max_length]
            unknown += int(np.count_nonzero(ids == 1))
            lengths.append(len(ids))
            records.append(token_records.serialize(ids.tolist(), int(label)))
    return records, np.asarray(lengths, dtype=np.int64), cut, unknown


def _write_tokens(staging: Path, split: str, raw_files: list[str], layer, max_length: int) -> dict:
    folder = staging / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    names, histogram, cut, unknown = [], np.zeros(max_length + 1, dtype=np.int64), 0, 0
    for index, raw in enumerate(raw_files):
        records, lengths, shard_cut, shard_unknown = _tokenize_shard(layer, raw, max_length)
        name = f"{split}.tfrecord-{index:05d}-of-{len(raw_files):05d}"
        token_records.write_file(folder / name, records)
        names.append(name)
        histogram += np.bincount(lengths, minlength=max_length + 1)
        cut, unknown = cut + shard_cut, unknown + shard_unknown
    return {"names": names, "histogram": histogram, "cut": cut, "unknown": unknown}


def build(data: TextDataConfig, target: Path, log: Callable[[str], None] = print) -> spec_lib.TextSpec:
    kind, argument = _kind(data)
    class_names, splits, skipped, counts = _splits(kind, argument, data)
    staging = target.parent / f"partial.{target.name}"
    shutil.rmtree(staging, ignore_errors=True)
    raw = {}
    for split, examples in splits.items():
        shards = max(1, min(data.num_shards, counts[split]))
        raw[split] = raw_shards.write_shards(staging / "raw", split, examples, shards)
    raw_files = {split: [str(staging / "raw" / name) for name in names] for split, names in raw.items()}
    log(f"Adapting the vocabulary on {counts['train']} training texts (at most {data.max_tokens} ids)")
    terms = vocabulary.adapt((text for text, _ in raw_shards.read_shards(raw_files["train"])), data.max_tokens)
    vocabulary.save_vocabulary(staging / "vocabulary.txt", terms)
    layer = vocabulary.vectorizer(vocabulary=terms)
    tokens = {split: _write_tokens(staging, split, raw_files[split], layer, data.max_length) for split in raw}
    train_tokens = int((tokens["train"]["histogram"] * np.arange(data.max_length + 1)).sum())
    spec = spec_lib.TextSpec(
        name=f"text_{kind}",
        root=target,
        source=data.source,
        class_names=tuple(class_names),
        vocab_size=len(terms),
        max_length=data.max_length,
        num_train=counts["train"],
        num_val=counts["validation"],
        raw_train=tuple(raw["train"]),
        raw_val=tuple(raw["validation"]),
        tokens_train=tuple(tokens["train"]["names"]),
        tokens_val=tuple(tokens["validation"]["names"]),
        length_histogram=tuple(int(n) for n in tokens["train"]["histogram"]),
        truncated=sum(part["cut"] for part in tokens.values()),
        skipped=len(skipped),
        skipped_examples=tuple(skipped[:20]),
        out_of_vocabulary=tokens["train"]["unknown"] / max(1, train_tokens),
    )
    spec_lib.write_spec(spec, staging)
    if skipped:
        log(f"Skipped {len(skipped)} bad row(s) (text.data.bad_rows: skip), e.g. {skipped[0]}")
    if spec.truncated:
        log(f"Cut {spec.truncated} text(s) longer than text.data.max_length ({data.max_length} tokens)")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, target)
    return spec_lib.read_spec(target)


def prepare(data: TextDataConfig, log: Callable[[str], None] = print) -> tuple[spec_lib.TextSpec, bool]:
    """Build the text dataset unless it is already there. Returns (spec, built_now)."""
    target = dataset_dir(data)
    if spec_lib.is_built(target):
        return spec_lib.read_spec(target), False
    log(f"Building the text dataset of text.data.source '{data.source}' into {target}")
    return build(data, target, log), True


def locate(data: TextDataConfig, build_hint: str = "python -m train data --config configs/text/naive.yaml"):
    """The built text dataset for `data`, or a UserError with the command that builds it."""
    target = dataset_dir(data)
    if not spec_lib.is_built(target):
        raise UserError(
            f"The text dataset for text.data.source '{data.source}' is not built: {target} does not exist. "
            f"Build it once with: {build_hint}"
        )
    return spec_lib.read_spec(target)
