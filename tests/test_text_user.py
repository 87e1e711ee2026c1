"""Playing the forker with text: a CSV, a JSONL file, a folder of .txt files per class; and every way
such input goes wrong, each answered with one paragraph naming the file, the line or key, and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.text_helpers import tiny_data_config
from train.core.errors import UserError
from train.workloads.text import build, raw_shards, user_text
from train.workloads.text import spec as spec_lib

REVIEWS = [
    ("A wonderful film, I loved it.", "pos"),
    ("Terrible acting and a boring plot.", "neg"),
    ("Great music; great cast!", "pos"),
    ("I want my two hours back.", "neg"),
] * 6


def quiet(line: str) -> None:
    pass


def write_csv(path: Path, rows, header=("review", "sentiment")) -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def data_for(tmp_path: Path, source: str, **changes):
    return tiny_data_config(tmp_path / "built", source=source, **{"num_shards": 2, "val_fraction": 0.25, **changes})


def test_a_csv_file_becomes_a_text_dataset(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", REVIEWS)
    data = data_for(tmp_path, f"csv:{path}", text_key="review", label_key="sentiment")
    spec, built = build.prepare(data, log=quiet)
    assert built and spec.class_names == ("neg", "pos") and spec.num_train + spec.num_val == 24
    assert spec.num_val > 0 and spec.skipped == 0
    texts = {
        text: label for raw in spec.raw_train_files + spec.raw_val_files for text, label in raw_shards.read_shard(raw)
    }
    assert texts["Great music; great cast!"] == 1 and texts["I want my two hours back."] == 0
    # duplicates of a text land in the same split (the split is a hash of the text)
    val_texts = {text for raw in spec.raw_val_files for text, _ in raw_shards.read_shard(raw)}
    train_texts = {text for raw in spec.raw_train_files for text, _ in raw_shards.read_shard(raw)}
    assert not val_texts & train_texts
    _, built = build.prepare(data, log=quiet)
    assert not built


def test_a_jsonl_file_with_integer_labels(tmp_path):
    path = tmp_path / "texts.jsonl"
    rows = [{"text": text, "label": int(label == "pos"), "id": i} for i, (text, label) in enumerate(REVIEWS)]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    spec, _ = build.prepare(data_for(tmp_path, f"jsonl:{path}"), log=quiet)
    assert spec.class_names == ("0", "1") and spec.num_train + spec.num_val == 24


def test_a_folder_of_text_files_per_class_with_and_without_given_splits(tmp_path):
    root = tmp_path / "reviews"
    for index, (text, label) in enumerate(REVIEWS):
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / f"{index}.txt").write_text(text)
    (root / "pos" / "notes.md").write_text("not a .txt file, not read")
    spec, _ = build.prepare(data_for(tmp_path, f"textfolder:{root}"), log=quiet)
    assert spec.class_names == ("neg", "pos") and spec.num_train + spec.num_val == 24
    given = tmp_path / "given"
    for split, rows in (("train", REVIEWS[:20]), ("test", REVIEWS[20:])):
        for index, (text, label) in enumerate(rows):
            (given / split / label).mkdir(parents=True, exist_ok=True)
            (given / split / label / f"{index}.txt").write_text(text)
    spec, _ = build.prepare(data_for(tmp_path, f"textfolder:{given}"), log=quiet)
    assert (spec.num_train, spec.num_val) == (20, 4)


def test_a_missing_column_names_the_file_the_columns_and_the_knob(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", REVIEWS)
    with pytest.raises(UserError) as error:
        build.prepare(data_for(tmp_path, f"csv:{path}", label_key="sentiment"), log=quiet)
    message = str(error.value)
    assert str(path) in message and "'text'" in message and "review, sentiment" in message
    assert "text.data.text_key" in message and "--set text.data.text_key=review" in message


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"text": "fine", "label": "pos"', "not a JSON object"),
        ('["a list"]', "a JSON list, not an object"),
        ('{"text": "", "label": "pos"}', "the text is empty"),
        ('{"text": "   ", "label": "pos"}', "the text is empty"),
        ('{"text": 42, "label": "pos"}', "the text is int, not a string"),
        ('{"text": "fine", "label": true}', "the label True is not a class name or an integer"),
        ('{"text": "fine", "label": 1.5}', "the label 1.5 is not a class name or an integer"),
        ('{"text": "fine"}', "no key 'label'"),
    ],
)
def test_a_bad_jsonl_row_raises_with_file_and_line_or_is_counted_and_skipped(tmp_path, line, problem):
    path = tmp_path / "texts.jsonl"
    good = [json.dumps({"text": text, "label": label}) for text, label in REVIEWS]
    path.write_text("\n".join(good[:3] + [line] + good[3:]) + "\n")
    with pytest.raises(UserError) as error:
        build.prepare(data_for(tmp_path, f"jsonl:{path}"), log=quiet)
    message = str(error.value)
    assert f"{path}, line 4: {problem}" in message and "text.data.bad_rows=skip" in message
    assert not list((tmp_path / "built").rglob(spec_lib.SPEC_FILE))
    lines = []
    spec, _ = build.prepare(data_for(tmp_path, f"jsonl:{path}", bad_rows="skip"), log=lines.append)
    assert spec.skipped == 1 and spec.num_train + spec.num_val == 24
    assert spec.skipped_examples[0].startswith(f"{path}, line 4: {problem}")
    assert any("Skipped 1 bad row(s)" in line for line in lines)


def test_bad_csv_rows_name_the_line(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text('review,sentiment\n"fine film",pos\nan unquoted, comma,neg\n"",neg\n"good",pos\n"bad",neg\n')
    data = data_for(tmp_path, f"csv:{path}", text_key="review", label_key="sentiment")
    with pytest.raises(UserError, match=r"line 3: the row has 3 fields, the header has 2\. Quote texts"):
        build.prepare(data, log=quiet)
    collection = user_text.read_source("csv", str(path), tiny_data_config(tmp_path, **_keys(bad_rows="skip")))
    assert len(collection.skipped) == 2 and "line 4: the text is empty" in collection.skipped[1]


def _keys(**changes):
    return {"text_key": "review", "label_key": "sentiment", "val_fraction": 0.3, **changes}


def test_input_that_cannot_train_a_classifier_is_refused(tmp_path):
    one_class = write_csv(tmp_path / "one.csv", [(text, "pos") for text, _ in REVIEWS])
    with pytest.raises(UserError, match="only the class 'pos'.*at least two classes"):
        build.prepare(data_for(tmp_path, f"csv:{one_class}", **_keys()), log=quiet)
    with pytest.raises(UserError, match=r"does not exist\. Point text\.data\.source"):
        build.prepare(data_for(tmp_path, f"csv:{tmp_path / 'missing.csv'}"), log=quiet)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("review,sentiment\ncaf\xe9 cr\xe8me,pos\n".encode("latin-1"))
    with pytest.raises(UserError, match="is not UTF-8 text.*iconv"):
        build.prepare(data_for(tmp_path, f"csv:{latin}", **_keys()), log=quiet)
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "a.txt").write_text("text without a class folder")
    with pytest.raises(UserError, match="1 .txt files but no class sub-folders"):
        build.prepare(data_for(tmp_path, f"textfolder:{loose}"), log=quiet)
    with pytest.raises(UserError, match="Unknown text.data.source 'cvs:x'. Did you mean 'csv'"):
        build.prepare(data_for(tmp_path, "cvs:x"), log=quiet)
    with pytest.raises(UserError, match="the validation split has no texts"):
        build.prepare(data_for(tmp_path, f"csv:{write_csv(tmp_path / 'r.csv', REVIEWS)}", **_keys(val_fraction=1e-9)))


def test_a_text_file_that_is_not_utf8_is_a_bad_row(tmp_path):
    root = tmp_path / "folder"
    for index, (text, label) in enumerate(REVIEWS):
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / f"{index}.txt").write_text(text)
    (root / "neg" / "latin.txt").write_bytes("tr\xe8s mauvais".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin\.txt: not UTF-8 text .*Save the file as UTF-8"):
        build.prepare(data_for(tmp_path, f"textfolder:{root}"), log=quiet)
    spec, _ = build.prepare(data_for(tmp_path, f"textfolder:{root}", bad_rows="skip"), log=quiet)
    assert spec.skipped == 1
