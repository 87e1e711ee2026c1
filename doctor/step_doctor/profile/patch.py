"""The unified diff of the user's source that makes the fixes `profile --prove` proved (profile/prove.py).

Each fix names the line that built a dataset (diagnose/dataset_sources.py); the call that built it
is found on that line in the file's syntax tree and edited there, in text, so everything else in
the file stays byte for byte: a keyword argument added before the call's closing parenthesis
(`num_parallel_calls=`, `num_parallel_reads=`), or a transformation chained after it (`.cache()`,
`.prefetch(...)`). Paths are relative to the folder prove ran in, so `git apply prove.patch` or
`patch -p1 < prove.patch` there applies it. The user's files are only read.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

METHOD_OF = {  # the dataset class a line built -> the method (or constructor) that built it
    "_MapDataset": "map",
    "_ParallelMapDataset": "map",
    "_BatchDataset": "batch",
    "_ParallelBatchDataset": "batch",
    "_PaddedBatchDataset": "padded_batch",
    "_RepeatDataset": "repeat",
    "_ShuffleDataset": "shuffle",
    "_FilterDataset": "filter",
    "_InterleaveDataset": "interleave",
    "_ParallelInterleaveDataset": "interleave",
    "_FlatMapDataset": "flat_map",
    "_UnbatchDataset": "unbatch",
    "_TakeDataset": "take",
    "_PrefetchDataset": "prefetch",
    "TFRecordDatasetV2": "TFRecordDataset",
}
KEYWORD = {"parallel-calls": ("map", "num_parallel_calls"), "parallel-reads": ("TFRecordDataset", "num_parallel_reads")}
CHAINED = {"cache": ".cache()", "prefetch": ".prefetch({tf}.data.AUTOTUNE)"}


class PatchError(Exception):
    """A fix that cannot be written into the file as it stands (the line changed, or no call there builds it)."""


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _tensorflow_name(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tensorflow":
                    return alias.asname or "tensorflow"
    return "tf"


def _call_at(tree: ast.Module, line: int, method: str) -> ast.Call:
    """The call of `method` that the frame at `line` made: its name on that line, the innermost first."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) == method and node.lineno <= line <= node.end_lineno:
            named_at = node.func.end_lineno if isinstance(node.func, ast.Attribute) else node.lineno
            found.append((named_at != line, node.end_lineno - node.lineno, node))
    if not found:
        raise PatchError(f"no call of {method}() on line {line}")
    return min(found, key=lambda f: f[:2])[2]


def _offset(lines: list[str], line: int, column: int) -> int:
    """A character offset in the text from ast's 1-based line and UTF-8 byte column."""
    before = sum(len(text) for text in lines[: line - 1])
    return before + len(lines[line - 1].encode()[:column].decode())


def edit(source: str, fixes: list[dict]) -> str:
    """The source with each fix written in; PatchError where one cannot be."""
    tree = ast.parse(source)
    tf = _tensorflow_name(tree)
    lines = source.splitlines(keepends=True)
    inserts: list[tuple[int, str]] = []
    for fix in fixes:
        name = fix["name"]
        if name in KEYWORD:
            method, keyword = KEYWORD[name]
            call = _call_at(tree, fix["line"], method)
            if any(k.arg == keyword for k in call.keywords):
                raise PatchError(f"{method}() on line {fix['line']} already passes {keyword}")
            end = _offset(lines, call.end_lineno, call.end_col_offset) - 1
            if source[end] != ")":
                raise PatchError(f"the call on line {fix['line']} does not end in ')'")
            before = source[:end].rstrip()
            comma = "" if before.endswith(("(", ",")) else ", "
            space = " " if before.endswith(",") else ""
            inserts.append((len(before), f"{comma}{space}{keyword}={tf}.data.AUTOTUNE"))
        elif name in CHAINED:
            method = METHOD_OF.get(fix.get("kind") or "")
            if method is None:
                raise PatchError(f"a {fix.get('kind')} is not built by a call this patch knows")
            call = _call_at(tree, fix["line"], method)
            inserts.append((_offset(lines, call.end_lineno, call.end_col_offset), CHAINED[name].format(tf=tf)))
        else:
            raise PatchError(f"no patch for the fix {name}")
    for at, text in sorted(inserts, reverse=True):
        source = source[:at] + text + source[at:]
    ast.parse(source)  # what it wrote must still be Python
    return source


def unified_diff(fixes: list[dict], cwd: Path) -> tuple[str, list[str]]:
    """The diff of every file the fixes touch, and a note for each fix it could not write."""
    by_file: dict[str, list[dict]] = {}
    for fix in fixes:
        by_file.setdefault(fix["file"], []).append(fix)
    parts, notes = [], []
    for file, group in sorted(by_file.items()):
        path = Path(file)
        try:
            before = path.read_text()
        except OSError as error:
            notes.append(f"{file}: not read ({error.strerror or error})")
            continue
        try:
            after = edit(before, group)
        except (PatchError, SyntaxError) as error:
            notes.append(f"{file}: {error}")
            continue
        try:
            shown = path.relative_to(cwd).as_posix()
        except ValueError:
            shown = path.as_posix().lstrip("/")
            notes.append(f"{file} lies outside {cwd}: apply its part from /, with patch -p1 -d /")
        parts.append(
            "".join(
                difflib.unified_diff(
                    before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{shown}", f"b/{shown}"
                )
            )
        )
    return "".join(parts), notes
