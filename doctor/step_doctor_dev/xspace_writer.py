"""XSpace profiles written with numpy, a column of events at a time (for diagnose_scale.py).

The wire format of xplane.proto: each event is a length-delimited field of its line, made
of a metadata id, an offset and a duration (varints) and its stats (small length-delimited
messages). Encoding one column (a field across n events) at a time keeps the Python work per
batch of events, not per event: a GB of events is written in about a minute.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from step_doctor.diagnose import xspace


def varints(values) -> tuple[np.ndarray, np.ndarray]:
    """Each value as a varint: (n, 10) bytes and how many of them are used."""
    v = np.asarray(values).astype(np.int64).view(np.uint64) if np.asarray(values).dtype != np.uint64 else values
    v = np.atleast_1d(v)
    out = np.empty((len(v), 10), dtype=np.uint8)
    size = np.ones(len(v), dtype=np.int64)
    for k in range(10):
        out[:, k] = (v >> np.uint64(7 * k)) & np.uint64(0x7F)
        if k:
            size += v >= np.uint64(1 << (7 * k))
    out |= ((np.arange(10) < size[:, None] - 1) * 0x80).astype(np.uint8)
    return out, size


def const(data: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.broadcast_to(np.frombuffer(data, dtype=np.uint8), (n, len(data))), np.full(n, len(data))


def join(columns: list) -> tuple[bytes, np.ndarray]:
    """Row by row, the used bytes of each column in order: (all rows' bytes, each row's length)."""
    matrix = np.concatenate([m for m, _ in columns], axis=1)
    used = np.concatenate([np.arange(m.shape[1]) < s[:, None] for m, s in columns], axis=1)
    return matrix[used].tobytes(), sum(s for _, s in columns)


def stat(stat_id: int, kind: str, values, n: int) -> list:
    """An XStat field inside an event: tag 0x22, length, metadata id, value (int, uint, ref, double, str)."""
    body = [const(b"\x08" + xspace.encode_varint(stat_id), n)]
    if kind == "double":
        body += [
            const(b"\x11", n),
            (np.ascontiguousarray(np.broadcast_to(values, n), "<f8").view(np.uint8).reshape(n, 8), np.full(n, 8)),
        ]
    elif kind == "str":
        body += [const(b"\x2a" + xspace.encode_varint(len(values)) + values, n)]
    else:
        tag = {"int": b"\x20", "uint": b"\x18", "ref": b"\x38"}[kind]
        body += [const(tag, n), varints(np.broadcast_to(values, n))]
    length = sum(s for _, s in body)
    return [const(b"\x22", n), varints(length)] + body


def encoded(metadata_id, offset_ps, duration_ps, stats: list) -> tuple[bytes, np.ndarray]:
    """XLine.events fields for n events, and each one's length in bytes.

    Each stat is (stat metadata id, kind, value or array of values); kinds: int, uint, ref, double, str.
    """
    n = len(offset_ps)
    body = [
        const(b"\x08", n),
        varints(np.broadcast_to(metadata_id, n)),
        const(b"\x10", n),
        varints(offset_ps),
        const(b"\x18", n),
        varints(duration_ps),
    ]
    for stat_id, kind, values in stats:
        body += stat(stat_id, kind, values, n)
    length = sum(s for _, s in body)
    return join([const(b"\x22", n), varints(length)] + body)


def events(metadata_id, offset_ps, duration_ps, stats: list) -> bytes:
    return encoded(metadata_id, offset_ps, duration_ps, stats)[0]


def interleave(parts: list[tuple[np.ndarray, bytes, np.ndarray]]) -> bytes:
    """Encoded events of several kinds, (sort keys, bytes, lengths) each, as one run in order of the keys."""
    keys = np.concatenate([k for k, _, _ in parts])
    data = np.frombuffer(b"".join(d for _, d, _ in parts), dtype=np.uint8)
    lengths = np.concatenate([n for _, _, n in parts])
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    order = np.argsort(keys, kind="stable")
    take = lengths[order]
    first = np.repeat(starts[order] - np.concatenate(([0], np.cumsum(take)[:-1])), take)
    return data[first + np.arange(int(take.sum()))].tobytes()


def field(number: int, payload_size: int) -> bytes:
    """The tag and length of a length-delimited field."""
    return xspace.encode_varint(number << 3 | 2) + xspace.encode_varint(payload_size)


def line(line_id: int, name: str, start_ns: int, events: Path) -> tuple[bytes, Path]:
    """An XLine field's head (tag, length, id, name, timestamp) and the file of its events."""
    head = xspace.MESSAGES["XLine"](id=line_id, name=name, timestamp_ns=start_ns).SerializeToString()
    return field(3, len(head) + events.stat().st_size) + head, events


def copy(source: Path | int, target, offset: int = 0, length: int | None = None) -> None:
    """Copy bytes from a file (or an open descriptor's range) into `target`, a few MB at a time."""
    if isinstance(source, Path):
        with open(source, "rb") as handle:
            shutil.copyfileobj(handle, target, 4 << 20)
        return
    end = offset + length
    while offset < end:
        data = os.pread(source, min(4 << 20, end - offset), offset)
        target.write(data)
        offset += len(data)
