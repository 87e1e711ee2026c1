"""TextSpec: what the pipeline and the model need to know about a built text dataset.

A built text dataset is one folder:

    text_spec.json        this spec (file names relative to the folder, so the folder can move)
    vocabulary.txt        one term per line, most frequent first; ids 0 and 1 are padding and unknown
    raw/                  <split>-0000i-of-0000N.jsonl: the checked texts (what the naive pipeline reads)
    tokens/               <split>.tfrecord-0000i-of-0000N: token ids + label (what the optimized one reads)

The spec also holds the training split's length histogram (texts per token count, after the cut
at max_length), from which bucket lengths, padding shares and steps per epoch are computed
without reading the data.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from train.core import files
from train.core.errors import UserError

SPEC_FILE = "text_spec.json"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class TextSpec:
    name: str
    root: Path
    source: str
    class_names: tuple[str, ...]
    vocab_size: int  # ids, padding and out-of-vocabulary included
    max_length: int  # no text has more tokens (longer ones were cut)
    num_train: int
    num_val: int
    raw_train: tuple[str, ...]  # file names under raw/
    raw_val: tuple[str, ...]
    tokens_train: tuple[str, ...]  # file names under tokens/
    tokens_val: tuple[str, ...]
    length_histogram: tuple[int, ...]  # training texts per token count 0..max_length
    truncated: int = 0  # texts cut at max_length (both splits)
    skipped: int = 0  # bad rows left out (data.bad_rows: skip)
    skipped_examples: tuple[str, ...] = ()  # the first few, one line each
    out_of_vocabulary: float = 0.0  # share of training tokens mapped to id 1

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def vocabulary_path(self) -> Path:
        return self.root / "vocabulary.txt"

    @property
    def raw_train_files(self) -> tuple[str, ...]:
        return tuple(str(self.root / "raw" / name) for name in self.raw_train)

    @property
    def raw_val_files(self) -> tuple[str, ...]:
        return tuple(str(self.root / "raw" / name) for name in self.raw_val)

    @property
    def train_files(self) -> tuple[str, ...]:
        return tuple(str(self.root / "tokens" / name) for name in self.tokens_train)

    @property
    def val_files(self) -> tuple[str, ...]:
        return tuple(str(self.root / "tokens" / name) for name in self.tokens_val)

    def lengths(self) -> np.ndarray:
        """The training split's token counts, one per text, sorted (rebuilt from the histogram)."""
        return np.repeat(np.arange(len(self.length_histogram)), self.length_histogram)

    def length_statistics(self) -> dict:
        lengths = self.lengths()
        if not len(lengths):
            return {"mean": 0.0, "median": 0.0, "p90": 0.0, "p99": 0.0, "max": 0}
        return {
            "mean": float(lengths.mean()),
            "median": float(np.median(lengths)),
            "p90": float(np.percentile(lengths, 90)),
            "p99": float(np.percentile(lengths, 99)),
            "max": int(lengths.max()),
        }


def is_built(directory: Path) -> bool:
    return (Path(directory) / SPEC_FILE).is_file()


def write_spec(spec: TextSpec, directory: Path) -> None:
    values = dataclasses.asdict(spec)
    values.pop("root")
    values["version"] = VERSION
    values["length_statistics"] = spec.length_statistics()  # for people reading the file; recomputed on read
    files.write_json(Path(directory) / SPEC_FILE, values)


def read_spec(directory: Path) -> TextSpec:
    path = Path(directory) / SPEC_FILE
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserError(
            f"{path} cannot be read ({error}). Delete the folder {directory} and build the text dataset again."
        ) from None
    if values.pop("version", None) != VERSION:
        raise UserError(
            f"{path} was written by another version of the template. Delete the folder {directory} and build "
            "the text dataset again."
        )
    values.pop("length_statistics", None)
    fields = {f.name: f for f in dataclasses.fields(TextSpec)}
    values = {key: tuple(value) if isinstance(value, list) else value for key, value in values.items() if key in fields}
    return TextSpec(root=Path(directory), **values)
