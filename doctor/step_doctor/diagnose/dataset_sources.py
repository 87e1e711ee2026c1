"""The line of the user's code that built each stage of a profile's tf.data iterator tree.

`step-doctor profile` records every dataset the script builds, with its class, its inputs and the
user's file and line (profile/site/dataset_sources.py), in <run>/dataset_sources.json beside the
profile. The trace names stages by their iterators (`Iterator::Root::Prefetch::BatchV2::ParallelMapV2`),
after tf.data's rewrites: a map written without num_parallel_calls may run as ParallelMapV2, a map
and a batch as one MapAndBatch, a prefetch injected at the root, Keras's own wrappers above. So a
stage's path is aligned with a chain of recorded datasets by kind, in order, both sides allowed to
skip (the longest common subsequence); a stage with no dataset of its own (an injected prefetch,
a reader opened inside an interleave's function) takes the line of the nearest stage above it that
has one. No file, or a stage no chain explains: no line, never a guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

FILE = "dataset_sources.json"

# class or iterator name (lower case, without "dataset", a leading "_" and a version suffix) -> one kind
KINDS = {
    "map": "map",
    "parallelmap": "map",
    "batch": "batch",
    "parallelbatch": "batch",
    "paddedbatch": "batch",
    "prefetch": "prefetch",
    "cache": "cache",
    "memorycache": "cache",
    "memorycacheimpl": "cache",
    "filecache": "cache",
    "filecacheimpl": "cache",
    "shuffle": "shuffle",
    "repeat": "repeat",
    "foreverrepeat": "repeat",
    "interleave": "interleave",
    "parallelinterleave": "interleave",
    "legacyparallelinterleave": "interleave",
    "flatmap": "flat_map",
    "filter": "filter",
    "parallelfilter": "filter",
    "take": "take",
    "skip": "skip",
    "tfrecord": "tfrecord",
    "textline": "textline",
    "fixedlengthrecord": "fixedlength",
    "tensorslice": "tensor_slice",
    "tensor": "tensors",
    "range": "range",
    "generator": "generator",
    "zip": "zip",
    "concatenate": "concatenate",
    "unbatch": "unbatch",
    "rebatch": "rebatch",
    "groupbywindow": "group_by_window",
    "window": "window",
    "snapshot": "snapshot",
    "scan": "scan",
    "shard": "shard",
    "autoshard": "shard",
}
FUSED = {  # one iterator that tf.data's optimizations made of two datasets, outermost first
    "mapandbatch": ("batch", "map"),
    "shuffleandrepeat": ("repeat", "shuffle"),
    "parallelmapandbatch": ("batch", "map"),
}


READERS = {  # a reader's public class, which builds the stage over its files and the reader stage in one call
    "tfrecorddatasetv2": ("flat_map", "interleave", "tfrecord"),  # FlatMap, or ParallelInterleave with parallel reads
    "textlinedatasetv2": ("flat_map", "interleave", "textline"),
    "fixedlengthrecorddatasetv2": ("flat_map", "interleave", "fixedlength"),
}


def kinds(name: str) -> tuple[str, ...]:
    """What one class or iterator name is, as the alignment compares them: () for what has no iterator."""
    if name.lower() in READERS:
        return READERS[name.lower()]
    plain = re.sub(r"\[\d+\]$", "", name).lower().lstrip("_")
    plain = re.sub(r"(dataset)?(v\d+)?$", "", plain).removesuffix("dataset")
    if plain in FUSED:
        return FUSED[plain]
    return (KINDS[plain],) if plain in KINDS else ((plain,) if plain else ())


@dataclass(frozen=True)
class SourceLine:
    """Where a stage was built: the user's file and line, the source text of that line, and the call."""

    file: str
    line: int
    code: str
    function: str | None = None
    kind: str | None = None  # the class of the dataset built there (_MapDataset, ...)

    def short(self, cwd: Path | None = None) -> str:
        path = Path(self.file)
        try:
            shown = path.relative_to(cwd or Path.cwd())
        except ValueError:
            shown = path
        return f"{shown}:{self.line}"

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "code": self.code, "function": self.function, "kind": self.kind}


class Sources:
    """The datasets one process built (its dataset_sources.json), and what each stage's line is."""

    def __init__(self, nodes: list[dict]):
        self.nodes = {n["id"]: n for n in nodes if isinstance(n, dict) and isinstance(n.get("id"), int)}
        used = {i for n in self.nodes.values() for i in n.get("inputs") or () if i is not None}
        self.terminals = sorted((i for i in self.nodes if i not in used), reverse=True)  # the newest first

    @classmethod
    def beside(cls, session: Path) -> Sources | None:
        """The record of the run whose profile session is `session` (<run>/plugins/profile/<session>), if any."""
        path = session.parent.parent.parent / FILE
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        nodes = document.get("datasets") if isinstance(document, dict) else None
        return cls(nodes) if isinstance(nodes, list) else None

    def chains(self, most: int = 400):
        """Chains of datasets from each terminal one down to a source, outermost first."""
        found = []
        for terminal in self.terminals:
            stack = [[terminal]]
            while stack and len(found) < most:
                chain = stack.pop()
                inputs = [i for i in self.nodes[chain[-1]].get("inputs") or () if i in self.nodes and i not in chain]
                if not inputs:
                    found.append(chain)
                for i in reversed(inputs):
                    stack.append([*chain, i])
        return found

    def lines(self, stage_paths) -> dict[str, SourceLine]:
        """The user's line that built each stage (or the nearest stage above it that has one), where one is known.

        The deepest stages choose the chain first (the one that explains most of their path; among equals one the
        script iterated, the earliest, then the newest built); the shallower ones prefer the chain already chosen,
        so the training dataset's stages are not matched to a validation dataset's of the same shape."""
        paths = sorted(set(stage_paths), key=lambda p: -p.count("::"))
        chains = self.chains()
        chosen: set[int] = set()  # terminals of the chains chosen so far
        found: dict[str, SourceLine] = {}
        for path in paths:
            components = [c for c in path.split("::") if c not in ("Iterator", "Root")]
            expanded = [(index, kind) for index, c in enumerate(components) for kind in kinds(c)]
            best, best_key = None, None
            for chain in chains:
                nodes = [(n, kind) for n in chain for kind in kinds(self.nodes[n]["kind"])]
                score, matched = _align([k for _, k in expanded], [k for _, k in nodes])
                if not score:
                    continue
                key = (score, chain[0] in chosen, -self._iterated(chain), chain[0])
                if best_key is None or key > best_key:
                    best, best_key = (chain, matched, nodes), key
            if best is None:
                continue
            chain, matched, nodes = best
            chosen.add(chain[0])
            by_component: dict[int, int] = {}
            for position, node_position in sorted(matched.items()):  # a fused stage: its inner dataset, whose
                by_component[expanded[position][0]] = nodes[node_position][0]  # function does the work
            for index in range(len(components) - 1, -1, -1):
                node = self.nodes.get(by_component.get(index))
                if node and node.get("file"):
                    line, code = int(node.get("line") or 0), node.get("code") or ""
                    found[path] = SourceLine(node["file"], line, code, node.get("function"), node.get("kind"))
                    break
        return found

    def _iterated(self, chain: list[int]) -> float:
        orders = [self.nodes[n]["iterated"] for n in chain if isinstance(self.nodes[n].get("iterated"), int)]
        return min(orders) if orders else float("inf")


def _align(trace: list[str], chain: list[str]) -> tuple[int, dict[int, int]]:
    """The longest common subsequence of the two kind lists: its length and trace position -> chain position."""
    rows, cols = len(trace), len(chain)
    table = [[0] * (cols + 1) for _ in range(rows + 1)]
    for i in range(rows - 1, -1, -1):
        for j in range(cols - 1, -1, -1):
            if trace[i] == chain[j]:
                table[i][j] = table[i + 1][j + 1] + 1
            else:
                table[i][j] = max(table[i + 1][j], table[i][j + 1])
    matched, i, j = {}, 0, 0
    while i < rows and j < cols:
        if trace[i] == chain[j]:
            matched[i] = j
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return table[0][0], matched
