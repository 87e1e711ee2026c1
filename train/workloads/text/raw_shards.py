"""Raw text shards: what a text dataset holds before tokenization, and what the naive pipeline reads.

One JSON object per line, `{"text": "...", "label": 2}`, N files per split named
`<split>-00000-of-0000N.jsonl`. Whatever the source (the synthetic corpus, a CSV or JSONL file, a
folder of .txt files), its checked rows end here, labels as class indices, so the naive reader
and the tokenizer read one format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path


def shard_name(split: str, index: int, count: int, suffix: str = "jsonl") -> str:
    return f"{split}-{index:05d}-of-{count:05d}.{suffix}"


def write_shards(folder: Path, split: str, examples: Iterable[tuple[str, int]], num_shards: int) -> list[str]:
    """Write `examples` round-robin into `num_shards` files of `folder` (a staging folder: the dataset is
    published in one rename when complete); returns the file names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [shard_name(split, index, num_shards) for index in range(num_shards)]
    handles = [open(folder / name, "w", encoding="utf-8") for name in names]
    try:
        for count, (text, label) in enumerate(examples):
            handles[count % num_shards].write(json.dumps({"text": text, "label": int(label)}) + "\n")
    finally:
        for handle in handles:
            handle.close()
    return names


def read_shard(path: str | Path) -> Iterator[tuple[str, int]]:
    """(text, label) of each line of one raw shard, in order."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            yield row["text"], row["label"]


def read_shards(paths: Iterable[str | Path]) -> Iterator[tuple[str, int]]:
    for path in paths:
        yield from read_shard(path)
