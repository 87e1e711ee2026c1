"""Your own text: a CSV or JSONL file with a text and a label column, or a folder of .txt files per class.

    csv:PATH          a header row, then one row per text; text.data.text_key / label_key name the columns
    jsonl:PATH        one JSON object per line with those two keys
    textfolder:PATH   PATH/<class>/*.txt, one text per file (the layout keras.utils.text_dataset_from_directory
                      reads); with PATH/train/<class>/ and PATH/validation/<class>/ (or val/, test/) the
                      splits are taken as given

Labels are class names (strings) or integers; classes are numbered in sorted order (numerically when
every name is a number). A single file's validation split is the texts whose hash falls under
text.data.val_fraction, so a text and its duplicates always land in the same split.

Problems of the whole input (a missing file or column, one class only) stop with one paragraph that
says what to change. A bad row (no text or label, a label that is not a name or an integer, a line
that is not JSON, an empty text) stops the same way naming the file and line, or, with
text.data.bad_rows: skip, is counted and left out.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from train.core.errors import UserError, did_you_mean
from train.workloads.text.settings import TextDataConfig

SPLIT_FOLDERS = ("validation", "val", "test")
SKIP_HINT = "or set text.data.bad_rows=skip to leave such rows out (they are counted)"


@dataclasses.dataclass
class Collection:
    """Checked texts of a source: class names, (text, class index) per split, what was skipped."""

    class_names: tuple[str, ...]
    splits: dict[str, list[tuple[str, int]]]
    skipped: list[str]


class _Rows:
    """Collects (text, label name) rows; a bad row raises or is counted, as text.data.bad_rows says."""

    def __init__(self, bad_rows: str):
        self.bad_rows = bad_rows
        self.rows: list[tuple[str, str]] = []
        self.skipped: list[str] = []

    def bad(self, where: str, problem: str, fix: str) -> None:
        if self.bad_rows == "raise":
            raise UserError(f"{where}: {problem}. {fix}, {SKIP_HINT}.")
        self.skipped.append(f"{where}: {problem}")

    def add(self, where: str, text, label) -> None:
        if not isinstance(text, str):
            self.bad(where, f"the text is {type(text).__name__}, not a string", "Put the text in quotes")
        elif not text.strip():
            self.bad(where, "the text is empty", "Fill in the text or delete the row")
        elif isinstance(label, bool) or not isinstance(label, (str, int)) or (isinstance(label, str) and not label):
            self.bad(
                where,
                f"the label {label!r} is not a class name or an integer",
                "Give every row a class name (a string) or a class number",
            )
        else:
            self.rows.append((text, str(label)))


def read_csv(path: Path, data: TextDataConfig, rows: _Rows) -> None:
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 26))  # long texts: the default stops at 128 KiB
    with _open_text(path) as handle:
        reader = csv.DictReader(handle)
        try:
            _check_columns(path, reader.fieldnames or [], data, "column")
            for row in reader:
                _csv_row(f"{path}, line {reader.line_num}", row, len(reader.fieldnames), data, rows)
        except csv.Error as error:
            raise UserError(
                f"{path}, line {reader.line_num}: not valid CSV ({error}). Fix the quoting on that line."
            ) from None
        except UnicodeDecodeError as error:
            raise _not_utf8(path, error) from None


def _csv_row(where: str, row: dict, expected: int, data: TextDataConfig, rows: _Rows) -> None:
    extra = len(row.get(None) or [])
    missing = sum(value is None for key, value in row.items() if key is not None)
    if extra or missing:
        rows.bad(
            where,
            f"the row has {expected + extra - missing} fields, the header has {expected}",
            "Quote texts that hold commas or line breaks",
        )
        return
    rows.add(where, row[data.text_key], row[data.label_key])


def read_jsonl(path: Path, data: TextDataConfig, rows: _Rows) -> None:
    with _open_text(path) as handle:
        checked = False
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}, line {number}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    rows.bad(where, f"not a JSON object ({error.msg})", "Write one JSON object per line")
                    continue
                if not isinstance(row, dict):
                    rows.bad(where, f"a JSON {type(row).__name__}, not an object", "Write one JSON object per line")
                    continue
                if not checked:
                    _check_columns(path, list(row), data, "key", f"line {number}")
                    checked = True
                missing = [key for key in (data.text_key, data.label_key) if key not in row]
                if missing:
                    rows.bad(where, f"no key '{missing[0]}'", f"Add '{missing[0]}' to the object")
                    continue
                rows.add(where, row[data.text_key], row[data.label_key])
        except UnicodeDecodeError as error:
            raise _not_utf8(path, error) from None


def _check_columns(path: Path, found: list[str], data: TextDataConfig, kind: str, where: str = "the header") -> None:
    for knob, key in (("text_key", data.text_key), ("label_key", data.label_key)):
        if key not in found:
            raise UserError(
                f"{path}: {where} has no {kind} '{key}' (text.data.{knob}).{did_you_mean(key, found)} "
                f"Its {kind}s: {', '.join(map(str, found)) or 'none'}. Set text.data.text_key and "
                f"text.data.label_key to the {kind}s that hold the text and the label, e.g. --set "
                f"text.data.{knob}={found[0] if found else key}, or rename the {kind} in the file."
            )


def _open_text(path: Path):
    if not path.is_file():
        raise UserError(f"{path} does not exist. Point text.data.source at your file, e.g. csv:data/reviews.csv.")
    return open(path, encoding="utf-8-sig", newline="")


def _not_utf8(path: Path, error: UnicodeDecodeError) -> UserError:
    return UserError(
        f"{path} is not UTF-8 text (byte {error.start} of a read block: {error.reason}). Save the file as UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8 in.csv > out.csv) and run again."
    )


def read_text_folder(root: Path, rows_by_split: dict[str, _Rows], given: bool) -> None:
    """Each .txt file of ROOT/<class>/ (or ROOT/<split>/<class>/) as one row of its folder's class."""
    folders = {"train": root / "train", "validation": _validation_folder(root)} if given else {"all": root}
    for split, folder in folders.items():
        for class_folder in _class_folders(folder):
            for path in sorted(class_folder.glob("*.txt")):
                try:
                    text = path.read_text(encoding="utf-8-sig")
                except UnicodeDecodeError as error:
                    rows_by_split[split].bad(
                        str(path), f"not UTF-8 text ({error.reason} at byte {error.start})", "Save the file as UTF-8"
                    )
                    continue
                rows_by_split[split].add(str(path), text, class_folder.name)


def _validation_folder(root: Path) -> Path | None:
    return next((root / name for name in SPLIT_FOLDERS if (root / name).is_dir()), None)


def _class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and any(p.glob("*.txt")))


def _folder_layout(argument: str) -> tuple[Path, bool]:
    root = Path(argument).expanduser()
    if not argument or not root.is_dir():
        raise UserError(
            f"text.data.source textfolder:{argument}: the folder {root} does not exist. Point it at a folder with "
            "one sub-folder of .txt files per class, e.g. textfolder:data/reviews (reviews/pos/1.txt, ...)."
        )
    given = (root / "train").is_dir() and _validation_folder(root) is not None
    classes = _class_folders(root / "train" if given else root)
    if not classes:
        loose = sorted(root.rglob("*.txt"))
        raise UserError(
            f"text.data.source textfolder:{argument}: {root} has "
            + (f"{len(loose)} .txt files but no class sub-folders" if loose else "no .txt files in class sub-folders")
            + f". Put each class in its own folder: {root}/<class name>/text.txt (the folder name is the label)."
        )
    return root, given


def held_out(text: str, fraction: float, seed: int) -> bool:
    digest = hashlib.sha1(f"{seed}:{text}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def read_source(kind: str, argument: str, data: TextDataConfig) -> Collection:
    """The checked rows of `kind:argument` (csv, jsonl or textfolder), split and numbered."""
    rows = {"all": _Rows(data.bad_rows), "train": _Rows(data.bad_rows), "validation": _Rows(data.bad_rows)}
    if kind == "textfolder":
        root, given = _folder_layout(argument)
        read_text_folder(root, rows, given)
    else:
        (read_csv if kind == "csv" else read_jsonl)(Path(argument).expanduser(), data, rows["all"])
    for text, label in rows["all"].rows:
        split = "validation" if held_out(text, data.val_fraction, data.seed) else "train"
        rows[split].rows.append((text, label))
    return _numbered(f"text.data.source {kind}:{argument}", rows)


def _numbered(where: str, rows: dict[str, _Rows]) -> Collection:
    skipped = [line for part in rows.values() for line in part.skipped]
    names = sorted({label for part in rows.values() for _, label in part.rows})
    if all(name.lstrip("-").isdigit() for name in names):
        names.sort(key=int)
    if len(names) < 2:
        found = f"only the class '{names[0]}'" if names else "no usable rows"
        raise UserError(
            f"{where}: {found} ({len(skipped)} rows skipped). A classifier needs texts of at least two classes."
        )
    index = {name: number for number, name in enumerate(names)}
    splits = {split: [(text, index[label]) for text, label in rows[split].rows] for split in ("train", "validation")}
    for split, examples in splits.items():
        if not examples:
            raise UserError(
                f"{where}: the {split} split has no texts. Add texts, or change text.data.val_fraction "
                f"(now it holds out {'too few' if split == 'validation' else 'every'} text)."
            )
    return Collection(tuple(names), splits, skipped)


def iterate(collection: Collection, split: str) -> Iterator[tuple[str, int]]:
    yield from collection.splits[split]
