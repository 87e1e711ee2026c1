"""The built-in text data: a seeded synthetic corpus that behaves like real text, made offline.

What makes text pipelines slow is in its statistics, so the corpus copies them:
- a Zipf vocabulary (frequency of the r-th word ~ 1/r^s, s about 1.1) of pseudo-words, the
  frequent ones short, as in real languages; more words than the tokenizer keeps, so some are
  out of vocabulary;
- log-normal lengths (median about 128 tokens, sigma about 0.7) with the long tail cut at
  `max_length`: padding every example to the longest wastes about two thirds of the slots;
- sentences: a capitalized first word and a full stop or comma, so standardization has work;
- a label carried by topic words spread through the text (a few per hundred tokens, from a set
  of mid-frequency words per class), not by the length, and a few percent of labels flipped.

Everything is drawn from one seed: the same arguments give the same corpus on any machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

ONSETS = ("", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "sh", "th", "br", "tr", "st")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
CODAS = ("", "", "n", "r", "s", "l", "t", "m")


@dataclasses.dataclass(frozen=True)
class CorpusShape:
    """The statistics of the synthetic corpus; the defaults are the built-in data."""

    num_classes: int = 4
    words: int = 30_000  # distinct pseudo-words (the tokenizer keeps the most frequent)
    zipf_s: float = 1.1
    median_length: float = 128.0
    length_sigma: float = 0.7
    min_length: int = 8
    max_length: int = 512  # the long tail is cut here
    topic_words: int = 40  # per class, drawn from ranks topic_ranks
    topic_ranks: tuple[int, int] = (200, 4000)
    topic_rate: float = 0.06  # share of a text's tokens that are topic words of its class
    label_noise: float = 0.03  # share of labels replaced by another class
    sentence_length: float = 14.0  # mean words per sentence


def pseudo_words(count: int, seed: int) -> list[str]:
    """`count` distinct pronounceable pseudo-words, shortest first (the frequent words of a language are short)."""
    rng = np.random.default_rng([seed, 1])
    syllables = [o + v + c for o in ONSETS for v in VOWELS for c in CODAS]
    found: dict[str, None] = {}
    while len(found) < count:
        batch = 4 * (count - len(found)) + 64
        sizes = 1 + rng.binomial(3, 0.45, batch)
        picks = rng.integers(len(syllables), size=(batch, 4))
        for size, row in zip(sizes, picks):
            found.setdefault("".join(syllables[i] for i in row[:size]), None)
    words = list(found)[:count]
    return sorted(words, key=len)


class Corpus:
    """Draws (text, label) examples; one `Corpus` per seed, any number of splits from it."""

    def __init__(self, shape: CorpusShape = CorpusShape(), seed: int = 0):
        self.shape = shape
        self.seed = seed
        self.words = np.array(pseudo_words(shape.words, seed), dtype=object)
        ranks = np.arange(1, shape.words + 1, dtype=np.float64)
        weights = ranks**-shape.zipf_s
        self.cumulative = np.cumsum(weights / weights.sum())
        rng = np.random.default_rng([seed, 2])
        low, high = shape.topic_ranks
        pool = np.arange(low, min(high, shape.words))
        chosen = rng.choice(pool, shape.num_classes * shape.topic_words, replace=False)
        self.topics = chosen.reshape(shape.num_classes, shape.topic_words)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(f"topic_{index}" for index in range(self.shape.num_classes))

    def lengths(self, rng: np.random.Generator, count: int) -> np.ndarray:
        shape = self.shape
        drawn = rng.lognormal(np.log(shape.median_length), shape.length_sigma, count)
        return np.clip(np.round(drawn), shape.min_length, shape.max_length).astype(np.int64)

    def examples(self, split: str, count: int) -> Iterator[tuple[str, int]]:
        """`count` examples of `split` (each split has its own stream of the same corpus)."""
        rng = np.random.default_rng([self.seed, 3, sum(split.encode())])
        shape = self.shape
        chunk = 1024
        for start in range(0, count, chunk):
            size = min(chunk, count - start)
            labels = rng.integers(shape.num_classes, size=size)
            lengths = self.lengths(rng, size)
            for label, length in zip(labels, lengths):
                yield self._text(rng, int(label), int(length)), self._noisy(rng, int(label))

    def _noisy(self, rng: np.random.Generator, label: int) -> int:
        if rng.random() >= self.shape.label_noise:
            return label
        return int((label + rng.integers(1, self.shape.num_classes)) % self.shape.num_classes)

    def _text(self, rng: np.random.Generator, label: int, length: int) -> str:
        ids = np.searchsorted(self.cumulative, rng.random(length), side="right")
        ids = np.minimum(ids, self.shape.words - 1)
        topical = rng.random(length) < self.shape.topic_rate
        ids[topical] = rng.choice(self.topics[label], int(topical.sum()))
        tokens = self.words[ids].tolist()
        ends = np.flatnonzero(rng.random(length) < 1.0 / self.shape.sentence_length)
        tokens[0] = tokens[0].capitalize()
        for end in ends:
            if end + 1 < length:
                comma = rng.random() < 0.3
                tokens[end] += "," if comma else "."
                if not comma:
                    tokens[end + 1] = tokens[end + 1].capitalize()
        tokens[-1] += "."
        return " ".join(tokens)
