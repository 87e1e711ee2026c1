"""Bucket lengths and batch sizes: few shapes, little padding, about the same work per step.

Rows are padded to their bucket's length, so a bucket covering lengths (a, b] wastes b - l slots
on a text of l tokens. `choose_lengths` finds, from the training split's length histogram, the
fewest bucket lengths (multiples of `multiple`) whose padding share stays under a target, by
dynamic programming over the candidate lengths. Each bucket's batch holds about `token_budget`
slots (rows = budget // length, a multiple of `multiple`), so a step on short texts does about
the work of a step on long ones, and with drop_remainder each bucket is one shape: one XLA
compile per bucket.
"""

from __future__ import annotations

import numpy as np


def _candidates(histogram: np.ndarray, multiple: int, max_length: int) -> np.ndarray:
    longest = int(np.flatnonzero(histogram).max()) if histogram.any() else 1
    top = min(max_length, -(-longest // multiple) * multiple)
    return np.unique(np.append(np.arange(multiple, top, multiple), top))


def _cost_table(histogram: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """cost[i, j]: padded slots when the texts longer than candidates[i] and up to candidates[j] (i < j)
    are padded to candidates[j]; row 0 stands for "from length 0"."""
    lengths = np.arange(len(histogram))
    counts = np.cumsum(histogram)  # texts of length <= l
    tokens = np.cumsum(histogram * lengths)
    edges = np.concatenate([[0], candidates])
    below_count = np.where(edges > 0, counts[np.minimum(edges, len(histogram) - 1)], histogram[0])
    below_tokens = np.where(edges > 0, tokens[np.minimum(edges, len(histogram) - 1)], 0)
    n = below_count[None, 1:] - below_count[:, None]
    t = below_tokens[None, 1:] - below_tokens[:, None]
    cost = n * candidates[None, :] - t
    cost = cost.astype(np.float64)
    cost[np.arange(len(edges))[:, None] > np.arange(len(candidates))[None, :]] = np.inf
    return cost  # [len(candidates) + 1, len(candidates)]


def best_lengths(histogram, buckets: int, multiple: int, max_length: int) -> tuple[list[int], float]:
    """The `buckets` lengths (or fewer) that pad the least, and the padded slots they waste."""
    histogram = np.asarray(histogram, dtype=np.int64)
    candidates = _candidates(histogram, multiple, max_length)
    cost = _cost_table(histogram, candidates)
    count = len(candidates)
    # best[k, j]: least waste covering lengths up to candidates[j] with k buckets, the last ending at j
    best = np.full((buckets + 1, count), np.inf)
    choice = np.zeros((buckets + 1, count), dtype=np.int64)
    best[1] = cost[0]
    for k in range(2, buckets + 1):
        totals = best[k - 1][:, None] + cost[1:]  # [previous end i, end j]
        choice[k] = np.argmin(totals, axis=0)
        best[k] = totals[choice[k], np.arange(count)]
    k = int(np.argmin(best[1:, -1])) + 1
    waste = float(best[k, -1])
    lengths, end = [], count - 1
    while k >= 1:
        lengths.append(int(candidates[end]))
        end = int(choice[k, end])
        k -= 1
    return sorted(set(lengths)), waste


def padding_share(histogram, lengths: list[int]) -> float:
    """Share of the slots that are padding when each text is padded to the first length that holds it."""
    histogram = np.asarray(histogram, dtype=np.int64)
    sizes = np.arange(len(histogram))
    padded_to = np.asarray(lengths)[np.searchsorted(lengths, sizes)].astype(np.float64) if len(lengths) else sizes
    real = float((histogram * sizes).sum())
    slots = float((histogram * padded_to).sum())
    return 1.0 - real / slots if slots else 0.0


def choose_lengths(histogram, max_padding: float, max_buckets: int, multiple: int, max_length: int) -> list[int]:
    """The fewest bucket lengths whose padding share is at most `max_padding` (else the best of `max_buckets`)."""
    for buckets in range(1, max_buckets + 1):
        lengths, _ = best_lengths(histogram, buckets, multiple, max_length)
        if padding_share(histogram, lengths) <= max_padding:
            return lengths
    return lengths


def batch_sizes(lengths: list[int], token_budget: int, multiple: int) -> list[int]:
    """Rows per batch for each bucket length: about `token_budget` slots, a multiple of `multiple` where it can."""
    sizes = []
    for length in lengths:
        rows = max(1, token_budget // length)
        sizes.append(rows // multiple * multiple if rows >= multiple else rows)
    return sizes


def steps_per_epoch(histogram, lengths: list[int], sizes: list[int]) -> int:
    """Full batches per pass over the training split (buckets fill across epochs, so fractions carry over)."""
    histogram = np.asarray(histogram, dtype=np.int64)
    bounds = np.concatenate([[-1], lengths])
    texts = [int(histogram[low + 1 : high + 1].sum()) for low, high in zip(bounds[:-1], bounds[1:])]
    return max(1, round(sum(count / size for count, size in zip(texts, sizes))))
