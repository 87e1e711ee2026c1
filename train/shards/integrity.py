"""Finding damaged records: which shard, which record, what is wrong, and what to do.

TensorFlow's TFRecord reader reports a damaged record with a byte offset but not the file,
and stops reading that file there. When a run fails on its data, or before a run with
`pipeline.skip_corrupt: true`, every shard is scanned here: framing and CRCs in Python
(the same checks TensorFlow makes), then the Example and the image are decoded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from train.shards import records
from train.shards.spec import DatasetSpec


@dataclasses.dataclass
class Problem:
    path: str
    index: int
    kind: str

    def __str__(self) -> str:
        return f"{Path(self.path).name} record {self.index}: {self.kind}"


@dataclasses.dataclass
class ShardScan:
    path: str
    good: list[bytes]  # payloads of the readable records, in order
    problems: list[Problem]


def scan_shard(path: str, spec: DatasetSpec) -> ShardScan:
    import tensorflow as tf

    good, problems = [], []
    for index, item in records.read_records(path):
        if isinstance(item, records.CorruptRecord):
            problems.append(Problem(path, index, item.kind))
            continue
        try:
            encoded, _ = records.parse_example(item)
            records.decode_image(tf.constant(encoded), spec)
        except ValueError as error:
            problems.append(Problem(path, index, str(error)))
            continue
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
            problems.append(Problem(path, index, f"image does not decode ({error.message.splitlines()[0][:120]})"))
            continue
        good.append(item)
    return ShardScan(path, good, problems)


def verify(spec: DatasetSpec) -> list[Problem]:
    """Framing, CRCs and record counts of every shard, without decoding (about 1 s per GB).

    Catches truncated, emptied and bit-flipped shards before any training starts.
    """
    problems = []
    for path, expected in spec.shard_lengths:
        if not Path(path).is_file():
            problems.append(Problem(path, 0, "shard file is missing"))
            continue
        count = 0
        for index, item in records.read_records(path):
            if isinstance(item, records.CorruptRecord):
                problems.append(Problem(path, index, item.kind))
            count = index + 1
        if count < expected and not any(p.path == path for p in problems):
            problems.append(Problem(path, count, f"shard ends after {count} of {expected} records"))
    return problems


def scan_dataset(spec: DatasetSpec) -> dict[str, ShardScan]:
    """Every shard of both splits, fully checked (framing, CRC, Example, image)."""
    return {path: scan_shard(path, spec) for path in spec.train_files + spec.val_files}


def describe(problems: list[Problem], limit: int = 3) -> str:
    shards = sorted({Path(p.path).name for p in problems})
    shown = "; ".join(str(p) for p in problems[:limit])
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return f"{len(problems)} damaged record(s) in {len(shards)} shard(s): {shown}{more}"
