"""The built-in text data: a corpus that behaves like text, one tokenizer in two places, a dataset built
once and atomically."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.text_helpers import tiny_data_config, tiny_text_spec  # noqa: F401 (a fixture)
from train.workloads.text import build, raw_shards, token_records, vocabulary
from train.workloads.text import spec as spec_lib
from train.workloads.text.corpus import Corpus, CorpusShape, pseudo_words


def test_the_corpus_is_seeded_and_has_the_statistics_of_text():
    corpus = Corpus(CorpusShape(words=5000), seed=3)
    again = Corpus(CorpusShape(words=5000), seed=3)
    first = list(corpus.examples("train", 400))
    assert first == list(again.examples("train", 400))
    assert first != list(Corpus(CorpusShape(words=5000), seed=4).examples("train", 400))
    assert list(corpus.examples("validation", 50)) != first[:50]
    lengths = corpus.lengths(np.random.default_rng(0), 20_000)
    assert 120 <= np.median(lengths) <= 136
    assert lengths.max() == 512 and lengths.min() >= 8 and 0.01 < np.mean(lengths == 512) < 0.05
    padding_to_512 = 1 - lengths.sum() / (512 * len(lengths))
    assert 0.65 < padding_to_512 < 0.72


def test_word_frequencies_follow_zipf_and_frequent_words_are_short():
    corpus = Corpus(CorpusShape(words=5000, topic_rate=0.0), seed=0)
    counts = {}
    for text, _ in corpus.examples("train", 600):
        for word in text.lower().split():
            word = word.strip(".,")
            counts[word] = counts.get(word, 0) + 1
    frequencies = np.array(sorted(counts.values(), reverse=True), dtype=float)
    ranks = np.arange(1, len(frequencies) + 1)
    slope = np.polyfit(np.log(ranks[5:500]), np.log(frequencies[5:500]), 1)[0]
    assert -1.3 < slope < -0.9
    words = pseudo_words(2000, seed=0)
    assert len(set(words)) == 2000 and np.mean([len(w) for w in words[:100]]) < np.mean([len(w) for w in words[-100:]])


def test_labels_are_balanced_noisy_and_not_given_by_the_length():
    corpus = Corpus(CorpusShape(words=5000, label_noise=0.1), seed=1)
    examples = list(corpus.examples("train", 2000))
    labels = np.array([label for _, label in examples])
    lengths = np.array([len(text.split()) for text, _ in examples])
    assert np.bincount(labels).min() > 400
    assert abs(np.corrcoef(labels, lengths)[0, 1]) < 0.08
    # topic words of the text's class appear throughout the text, in both halves
    topic_words = {str(w) for w in corpus.words[corpus.topics[0]]}
    text = next(text for text, label in examples if label == 0 and len(text.split()) > 200)
    words = [w.strip(".,").lower() for w in text.split()]
    half = len(words) // 2
    assert topic_words & set(words[:half]) and topic_words & set(words[half:])


@pytest.mark.parametrize(
    "text",
    [
        "Hello, World! It's a test.",
        "  tabs\tand\nnewlines\r\nand  double  spaces ",
        "UPPER lower MiXeD... (brackets) [more] {curly} back\\slash ~tilde~ `tick`",
        "Ünïcode Straße café ΑΒΓ: only ASCII letters are lowercased",
        "",
        "!!! ???",
        "unknownword anotherunknown hello",
    ],
)
def test_the_python_tokenizer_gives_the_layers_ids(text):
    terms = vocabulary.adapt(["hello world its a test tabs and newlines", "upper lower mixed café straße"], 50)
    layer = vocabulary.vectorizer(vocabulary=terms)
    expected = layer([text]).to_list()[0]
    assert vocabulary.PythonTokenizer(terms)(text) == expected


def test_the_vocabulary_round_trips_and_reserves_padding_and_unknown(tmp_path):
    terms = vocabulary.adapt(["b a a c c c", "c d"], max_tokens=4)
    assert terms == ["", "[UNK]", "c", "a"]
    vocabulary.save_vocabulary(tmp_path / "vocabulary.txt", terms)
    assert (tmp_path / "vocabulary.txt").read_text() == "c\na\n"
    loaded = vocabulary.load_vocabulary(tmp_path / "vocabulary.txt")
    assert loaded == terms
    assert vocabulary.vectorizer(vocabulary=loaded)(["c a b"]).to_list() == [[2, 3, 1]]


def test_the_built_dataset_holds_raw_texts_token_ids_and_a_spec(tiny_text_spec):  # noqa: F811
    spec = tiny_text_spec
    assert spec.num_train == 192 and spec.num_val == 48 and spec.num_classes == 4
    assert len(spec.raw_train_files) == len(spec.train_files) == 2
    assert sum(spec.length_histogram) == spec.num_train and spec.vocab_size <= 3000
    assert 100 < spec.length_statistics()["median"] < 160
    assert spec.vocabulary_path.is_file() and 0 < spec.out_of_vocabulary < 0.2
    tokenize = vocabulary.PythonTokenizer(vocabulary.load_vocabulary(spec.vocabulary_path))
    import tensorflow as tf

    for raw, tokens in zip(spec.raw_val_files, spec.val_files):
        from_text = [(label, tokenize(text)) for text, label in raw_shards.read_shard(raw)]
        stored = [token_records.parse(payload) for payload in tf.data.TFRecordDataset(tokens)]
        assert from_text == [(int(label), ids.numpy().tolist()) for ids, label in stored]
    saved = json.loads((spec.root / spec_lib.SPEC_FILE).read_text())
    assert saved["length_statistics"]["max"] <= 512 and "root" not in saved


def test_the_vocabulary_is_adapted_on_the_training_split_only(tmp_path):
    rows = [{"text": f"common words here {'alpha' if i % 2 else 'beta'}", "label": i % 2} for i in range(40)]
    rows.append({"text": "zzzonlyinvalidation common", "label": 0})
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = tiny_data_config(tmp_path / "built", source=f"jsonl:{path}", num_shards=1, val_fraction=0.3)
    spec, _ = build.prepare(data, log=lambda line: None)
    validation = [text for raw in spec.raw_val_files for text, _ in raw_shards.read_shard(raw)]
    terms = vocabulary.load_vocabulary(spec.vocabulary_path)
    for word in {w for text in validation for w in text.split()} - {
        w for raw in spec.raw_train_files for text, _ in raw_shards.read_shard(raw) for w in text.split()
    }:
        assert word not in terms


def test_long_texts_are_cut_and_counted(tmp_path):
    data = tiny_data_config(tmp_path, num_train=64, num_val=16, max_length=64)
    spec, built = build.prepare(data, log=lambda line: None)
    assert built and spec.truncated > 40 and spec.length_statistics()["max"] == 64
    assert len(spec.length_histogram) == 65
    again, built = build.prepare(data, log=lambda line: None)
    assert not built and again == spec


def test_an_interrupted_build_leaves_nothing_that_looks_built(tmp_path, monkeypatch):
    data = tiny_data_config(tmp_path, num_train=32, num_val=8)
    original = token_records.write_file

    def fail_on_validation(path, payloads):
        if "validation" in path.name:
            raise KeyboardInterrupt
        return original(path, payloads)

    monkeypatch.setattr(token_records, "write_file", fail_on_validation)
    with pytest.raises(KeyboardInterrupt):
        build.prepare(data, log=lambda line: None)
    target = build.dataset_dir(data)
    assert not spec_lib.is_built(target) and not target.exists()
    monkeypatch.setattr(token_records, "write_file", original)
    spec, built = build.prepare(data, log=lambda line: None)
    assert built and spec.num_train == 32
    assert not list(target.parent.glob("partial.*"))
