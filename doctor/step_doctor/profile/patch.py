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
import re
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
# fix -> (the call, its keyword, its place among the positional arguments)
KEYWORD = {
    "parallel-calls": ("map", "num_parallel_calls", 1),
    "parallel-reads": ("TFRecordDataset", "num_parallel_reads", 3),
}
CHAINED = {"cache": ".cache()", "prefetch": ".prefetch({autotune})"}
CHAINED_ORDER = {"cache": 1, "prefetch": 2}
LEADING = re.compile(r"(?:\s|#[^\n]*)*")  # the line breaks and comments before a chained call's dot


class PatchError(Exception):
    """A fix that cannot be written into the file as it stands (the line changed, or no call there builds it)."""


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _autotune(tree: ast.Module) -> str:
    """tf.data.AUTOTUNE under the name the file imports TensorFlow as; its value (-1) where it binds no such name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("tensorflow", "tensorflow.compat.v2") and (alias.asname or "." not in alias.name):
                    return f"{alias.asname or alias.name}.data.AUTOTUNE"
    return "-1"


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


def _cache_below(source: str, lines: list[str], tree: ast.Module, fix: dict) -> list[tuple[int, str]]:
    """`x.shuffle(n).repeat().map(f)` as `x.map(f).cache().shuffle(n).repeat()`: the cache prove tried below the
    repeat and the shuffle the map reads (site/fixes.py: the same elements in the same order, for a function without
    random ops), moving what the trial moved. The repeat and the shuffle may be written in the map's chain or in the
    assignment of the name the map is called on (`ds = x.shuffle(n).repeat()` and, later, `ds = ds.map(f)`)."""
    line = fix["line"]
    call = _call_at(tree, line, "map")
    moved = [
        name for name, done in (("repeat", fix.get("below_repeat")), ("shuffle", fix.get("moved_shuffle"))) if done
    ]
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    written = " and ".join(f"{name}()" for name in moved)
    reads, receiver_name = [], None
    if isinstance(receiver, ast.Name):
        receiver_name = receiver.id
        receiver, reads = _assigned(tree, receiver, call.lineno)
    chain = []  # the moved calls, outermost first
    for name in moved:
        if not (
            isinstance(receiver, ast.Call)
            and _called_name(receiver) == name
            and isinstance(receiver.func, ast.Attribute)
        ):
            raise PatchError(
                f"the map on line {line} reads a {written} written elsewhere: cache right after the map by hand and "
                f"call {written} after the cache, `ds.map(f).cache()"
                + "".join(f".{n}(...)" for n in reversed(moved))
                + "`"
            )
        chain.append(receiver)
        receiver = receiver.func.value
    if reads:
        raise PatchError(
            f"`{receiver_name}`, which the map on line {line} reads, is read on line {reads[0]} too, where moving its "
            "calls after the cache would change it: cache right after the map by hand"
        )
    # from the first moved call's dot: the line breaks and comments before it stay where they are
    cut_to, end = _end(lines, chain[0]), _end(lines, call)
    cut_from = LEADING.match(source, _end(lines, receiver)).end()
    texts = [source[LEADING.match(source, _end(lines, c.func.value)).end() : _end(lines, c)] for c in reversed(chain)]
    return [(cut_from, ("cut", cut_to)), (end, ".cache()" + "".join(texts))]


def _end(lines: list[str], node: ast.AST) -> int:
    return _offset(lines, node.end_lineno, node.end_col_offset)


def _assigned(tree: ast.Module, read: ast.Name, before: int) -> tuple[ast.expr | None, list[int]]:
    """The value last assigned to the name `read` reads (`name = ...`) before line `before`, in the function or
    module it is read in, and the other lines that read that value (a change of it would change them too)."""
    functions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= before <= node.end_lineno
    ]
    scope = max(functions, key=lambda node: node.lineno) if functions else tree  # the innermost
    nodes = list(_own_nodes(scope))
    found = None
    for node in nodes:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == read.id
            and node.end_lineno < before
            and (found is None or node.lineno > found.lineno)
        ):
            found = node
    if found is None:
        return None, []
    # the statements that read this value: up to the one that binds the name again (the map's own, as a rule)
    rebound = [
        n.end_lineno
        for n in nodes
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and n.lineno > found.end_lineno
        and any(isinstance(t, ast.Name) and t.id == read.id for t in (getattr(n, "targets", None) or [n.target]))
    ]
    last = min(rebound, default=float("inf"))
    others = [
        n.lineno
        for n in nodes
        if isinstance(n, ast.Name)
        and n.id == read.id
        and isinstance(n.ctx, ast.Load)
        and n is not read
        and found.end_lineno < n.lineno <= last
    ]
    return found.value, others


def _own_nodes(scope):
    """The nodes of a function or module, not those of the functions and classes inside it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def edit(source: str, fixes: list[dict]) -> str:
    """The source with each fix written in; PatchError where one cannot be."""
    tree = ast.parse(source)
    autotune = _autotune(tree)
    lines = source.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + lines[-1:]  # as ast counts them: on newlines only
    inserts: list[tuple[int, str]] = []
    # a cache before a prefetch where both follow one call, as a trial applies them (site/fixes.py AFTER)
    for fix in sorted(fixes, key=lambda f: CHAINED_ORDER.get(f["name"], 0)):
        name = fix["name"]
        if name in KEYWORD:
            method, keyword, place = KEYWORD[name]
            call = _call_at(tree, fix["line"], method)
            if any(k.arg == keyword for k in call.keywords) or len(call.args) > place:
                raise PatchError(f"{method}() on line {fix['line']} already passes {keyword}")
            arguments = [*call.args, *call.keywords]
            if not arguments:
                raise PatchError(f"{method}() on line {fix['line']} has no arguments to add {keyword} after")
            last = max(arguments, key=lambda a: (a.end_lineno, a.end_col_offset))
            # right after the last argument, so a comment or a trailing comma after it stays where it is
            inserts.append((_offset(lines, last.end_lineno, last.end_col_offset), f", {keyword}={autotune}"))
        elif name == "cache" and (fix.get("below_repeat") or fix.get("moved_shuffle")):
            inserts += _cache_below(source, lines, tree, fix)
        elif name in CHAINED:
            method = METHOD_OF.get(fix.get("kind") or "")
            if method is None:
                raise PatchError(f"a {fix.get('kind')} is not built by a call this patch knows")
            call = _call_at(tree, fix["line"], method)
            end = _offset(lines, call.end_lineno, call.end_col_offset)
            if source[end - 1] != ")":
                raise PatchError(f"the call on line {fix['line']} does not end in ')'")
            inserts.append((end, CHAINED[name].format(autotune=autotune)))
        else:
            raise PatchError(f"no patch for the fix {name}")
    # from the end, so offsets hold; at one offset the later fix first, so the text reads in the order of the fixes
    for at, _, text in sorted(((at, i, text) for i, (at, text) in enumerate(inserts)), reverse=True):
        if isinstance(text, tuple):  # ("cut", to): text moved elsewhere
            source = source[:at] + source[text[1] :]
        else:
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
        except (OSError, UnicodeDecodeError) as error:
            notes.append(f"{file}: not read ({getattr(error, 'strerror', None) or error})")
            continue
        try:
            after = edit(before, group)
        except (PatchError, SyntaxError, ValueError) as error:
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
