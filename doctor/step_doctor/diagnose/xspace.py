"""An XSpace profile (`*.xplane.pb`) read in place: planes, lines and events streamed from disk.

The file is one protobuf message (TSL's xplane.proto: XSpace > XPlane > XLine > XEvent >
XStat). It is never read whole: `XSpaceFile` walks the top-level fields to find each plane's
byte range (so a truncated file is named before anything else is read), reads a plane's
metadata (event and stat names) and line headers, and `events` streams one line's events in
blocks of a few MB. A block's event headers (metadata id, offset, duration) are decoded with
numpy, without one Python object per event; the caller parses the stats of only the events
it keeps (`parse_events`).

The message classes are built at run time from the field numbers of the public schema
(openxla/xla: xla/tsl/profiler/protobuf/xplane.proto): the only generated module on this
machine is inside the TensorFlow wheel, which the analyser must not import.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

BLOCK_BYTES = 4 << 20  # one read of a line's events: big enough for numpy, small next to a GB profile
_WINDOW = 64 << 10  # one read while walking a message's fields (metadata entries are small)
_EVENT_TAG = 0x22  # XLine.events: field 4, length-delimited
_LARGE_METADATA = 4 << 10  # an event metadata larger than this is read alone, its stats dropped (metadata_stats)


class XSpaceError(Exception):
    """The file is not a readable XSpace; the message says where it broke."""


# xplane.proto's messages, the fields read here: (number, name, type, "repeated" or a oneof's name or None)
_SCHEMA = {
    "XStat": [
        (1, "metadata_id", "int64", None),
        (2, "double_value", "double", "value"),
        (3, "uint64_value", "uint64", "value"),
        (4, "int64_value", "int64", "value"),
        (5, "str_value", "string", "value"),
        (6, "bytes_value", "bytes", "value"),
        (7, "ref_value", "uint64", "value"),
    ],
    "XEvent": [
        (1, "metadata_id", "int64", None),
        (2, "offset_ps", "int64", "data"),
        (5, "num_occurrences", "int64", "data"),
        (3, "duration_ps", "int64", None),
        (4, "stats", "XStat", "repeated"),
    ],
    "XLine": [
        (1, "id", "int64", None),
        (10, "display_id", "int64", None),
        (2, "name", "string", None),
        (11, "display_name", "string", None),
        (3, "timestamp_ns", "int64", None),
        (9, "duration_ps", "int64", None),
        (4, "events", "XEvent", "repeated"),
    ],
    "XEventMetadata": [
        (1, "id", "int64", None),
        (2, "name", "string", None),
        (4, "display_name", "string", None),
        (3, "metadata", "bytes", None),
        (5, "stats", "XStat", "repeated"),
        (6, "child_id", "int64", "repeated"),
    ],
    "XStatMetadata": [(1, "id", "int64", None), (2, "name", "string", None), (3, "description", "string", None)],
    "XPlane": [
        (1, "id", "int64", None),
        (2, "name", "string", None),
        (3, "lines", "XLine", "repeated"),
        (4, "event_metadata", "XPlane.EventMetadataEntry", "repeated"),
        (5, "stat_metadata", "XPlane.StatMetadataEntry", "repeated"),
        (6, "stats", "XStat", "repeated"),
    ],
    "XSpace": [
        (1, "planes", "XPlane", "repeated"),
        (2, "errors", "string", "repeated"),
        (3, "warnings", "string", "repeated"),
        (4, "hostnames", "string", "repeated"),
    ],
}
_MAPS = {"XPlane": [("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata")]}
_PACKAGE = "gpu_template.xplane"


def _schema() -> dict:
    """XSpace's message classes for the fields read here (names as in xplane.proto, a package of our own)."""
    T = descriptor_pb2.FieldDescriptorProto
    scalar = {"int64": T.TYPE_INT64, "uint64": T.TYPE_UINT64, "double": T.TYPE_DOUBLE, "string": T.TYPE_STRING}
    scalar["bytes"] = T.TYPE_BYTES
    fd = descriptor_pb2.FileDescriptorProto(name="gpu_template_xplane.proto", package=_PACKAGE)

    def add(message, number, name, kind, how, oneofs):
        label = T.LABEL_REPEATED if how == "repeated" else T.LABEL_OPTIONAL
        field = message.field.add(name=name, number=number, label=label)
        if kind in scalar:
            field.type = scalar[kind]
        else:
            field.type, field.type_name = T.TYPE_MESSAGE, f".{_PACKAGE}.{kind}"
        if how not in (None, "repeated"):
            if how not in oneofs:
                oneofs[how] = len(oneofs)
                message.oneof_decl.add(name=how)
            field.oneof_index = oneofs[how]

    for name, fields in _SCHEMA.items():
        message = fd.message_type.add(name=name)
        for entry, value in _MAPS.get(name, []):
            nested = message.nested_type.add(name=entry)
            nested.options.map_entry = True
            add(nested, 1, "key", "int64", None, {})
            add(nested, 2, "value", value, None, {})
        oneofs: dict[str, int] = {}
        for number, field_name, kind, how in fields:
            add(message, number, field_name, kind, how, oneofs)
    pool = descriptor_pool.DescriptorPool()  # a private pool: TensorFlow's own xplane.proto may be loaded too
    pool.Add(fd)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in ("XSpace", "XPlane", "XLine", "XEvent", "XStat")
    }


MESSAGES = _schema()


def stat_value(stat, stat_names: dict[int, str]):
    """An XStat's value as Python: int, float, str or bytes; a reference is the referenced name."""
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    return stat_names.get(value, "") if kind == "ref_value" else value


def read_varint(buf, pos: int, end: int, error: type[Exception] = XSpaceError) -> tuple[int, int]:
    """(value, position after it) of the varint at buf[pos]; `error` past `end` (hlo.py reads HloProtos with it)."""
    result, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise error(f"a varint runs past the end of its data at byte {pos}")
        byte = buf[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return result, pos
        shift += 7


def _skip(wire: int, buf, pos: int, end: int) -> int:
    """Position after the value of a field of this wire type (its tag already read)."""
    if wire == 0:
        return read_varint(buf, pos, end)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        length, pos = read_varint(buf, pos, end)
        return pos + length
    if wire == 5:
        return pos + 4
    raise XSpaceError(f"unsupported wire type {wire} at byte {pos}")


@dataclass(eq=False)
class Line:
    plane: Plane
    offset: int  # where the line's bytes start in the file
    length: int
    id: int = 0
    name: str = ""
    display_name: str = ""
    timestamp_ns: int = 0
    events_at: int | None = None  # file offset of the first event, None when the line has none

    @property
    def thread(self) -> str:
        return self.display_name or self.name


@dataclass(eq=False)
class Plane:
    index: int
    offset: int
    length: int
    id: int = 0
    name: str = ""
    lines: list[Line] = field(default_factory=list)
    event_names: dict[int, str] = field(default_factory=dict)
    display_names: dict[int, str] = field(default_factory=dict)
    stat_names: dict[int, str] = field(default_factory=dict)
    stats: dict[str, object] = field(default_factory=dict)  # the plane's own stats, by name


@dataclass
class Block:
    """One read of a line's events: the raw bytes and each event's header, decoded with numpy."""

    data: bytes
    starts: np.ndarray  # where each event's field starts in `data` (its tag byte)
    ends: np.ndarray  # where it ends
    metadata_id: np.ndarray  # int64
    offset_ps: np.ndarray  # int64, from the line's timestamp
    duration_ps: np.ndarray  # int64
    stats_at: np.ndarray  # where the rest of each event (its stats) starts: data[stats_at:ends] is an XEvent

    def stats(self, which: np.ndarray) -> list[bytes]:
        """The stats of the events `which`, each as bytes that parse as an XEvent (MESSAGES["XEvent"])."""
        return [self.data[a:b] for a, b in zip(self.stats_at[which].tolist(), self.ends[which].tolist())]


class XSpaceFile:
    """Index of one profile file; planes and their lines are known, events are read on demand."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.size = os.path.getsize(self.path)
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            self.hostnames: list[str] = []
            # what the profiler itself reported while capturing, e.g. "Insufficient privilege to run libcupti"
            self.errors: list[str] = []
            self.warnings: list[str] = []
            self.planes = [self._plane(i, off, n) for i, (off, n) in enumerate(self._top_level())]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def _fields(self, start: int, end: int, want: set[int]) -> Iterator[tuple[int, int, int, int, bytes | None]]:
        """(field number, wire type, offset of its value, its length, its bytes when `want`ed) of each field."""
        window, window_at = b"", start
        pos = start
        while pos < end:
            if pos + 20 > window_at + len(window):  # a tag and a length fit in what is read
                window_at, window = pos, self._read(pos, min(_WINDOW, end - pos))
            key, after = read_varint(window, pos - window_at, len(window))
            number, wire = key >> 3, key & 7
            if wire == 2:
                length, value_at = read_varint(window, after, len(window))
                value_at += window_at
            else:
                value_at = after + window_at
                length = _skip(wire, window, after, len(window)) - after
            if value_at + length > end:
                raise XSpaceError(
                    f"the field at byte {pos} needs {length} bytes but its message ends {end - value_at} bytes later"
                )
            data = None
            if number in want or wire != 2:
                local = value_at - window_at
                if local + length <= len(window):
                    data = window[local : local + length]
                else:
                    data = self._read(value_at, length)
            yield number, wire, value_at, length, data
            pos = value_at + length

    def _top_level(self) -> list[tuple[int, int]]:
        planes = []
        texts = {2: self.errors, 3: self.warnings, 4: self.hostnames}
        for number, wire, at, length, data in self._fields(0, self.size, set(texts)):
            if number == 1 and wire == 2:
                planes.append((at, length))
            elif number in texts and wire == 2 and data is not None:
                texts[number].append(data.decode(errors="replace"))
        return planes

    def _plane(self, index: int, offset: int, length: int) -> Plane:
        plane = Plane(index, offset, length)
        rest, large = [], []
        for number, wire, at, size, data in self._fields(offset, offset + length, {1, 2, 4, 5, 6}):
            if number == 3 and wire == 2:
                plane.lines.append(Line(plane, at, size))
            elif number == 4 and size > _LARGE_METADATA:  # its name kept, not its stats (an XLA executable's HloProto)
                large += [
                    (key, meta.name, meta.display_name)
                    for key, meta in self._entry(index, size, data).event_metadata.items()
                ]
            elif number in (1, 2, 4, 5, 6):
                rest.append(encode_varint(number << 3 | wire) + (encode_varint(size) if wire == 2 else b"") + data)
        try:
            head = MESSAGES["XPlane"].FromString(b"".join(rest))
        except Exception as error:  # upb raises DecodeError on damaged bytes
            raise XSpaceError(f"plane {index} (at byte {offset}) has unreadable metadata ({error})") from None
        plane.id, plane.name = head.id, _text(head.name)
        named = [(key, meta.name, meta.display_name) for key, meta in head.event_metadata.items()]
        for key, name, display in large + named:  # (a rename appended later replaces a large entry)
            plane.event_names[key] = _text(name)
            if display:
                plane.display_names[key] = _text(display)
        plane.stat_names = {key: _text(meta.name) for key, meta in head.stat_metadata.items()}
        plane.stats = {plane.stat_names.get(s.metadata_id, ""): stat_value(s, plane.stat_names) for s in head.stats}
        for line in plane.lines:
            self._line_header(line)
        return plane

    def metadata_stats(self, plane: Plane, wanted: set[str]) -> Iterator[tuple[str, dict]]:
        """(event name, {stat name: value}) of each event metadata of the plane that carries one of the `wanted` stats,
        read again from the file an entry at a time: a Plane keeps names only (the HloProto that /host:metadata
        holds for each XLA executable is tens of KB)."""
        ids = {i for i, name in plane.stat_names.items() if name in wanted}
        if not ids:
            return
        for number, wire, _, size, data in self._fields(plane.offset, plane.offset + plane.length, {4}):
            if number != 4 or wire != 2 or data is None:
                continue
            for meta in self._entry(plane.index, size, data).event_metadata.values():
                found = {
                    plane.stat_names[stat.metadata_id]: stat_value(stat, plane.stat_names)
                    for stat in meta.stats
                    if stat.metadata_id in ids
                }
                if found:
                    yield _text(meta.name), found

    @staticmethod
    def _entry(index: int, size: int, data: bytes):
        """One event metadata entry of plane `index`, as an XPlane that holds only it."""
        try:
            return MESSAGES["XPlane"].FromString(encode_varint(4 << 3 | 2) + encode_varint(size) + data)
        except Exception as error:  # upb raises DecodeError on damaged bytes
            raise XSpaceError(f"an event metadata of plane {index} is unreadable ({error})") from None

    def _line_header(self, line: Line) -> None:
        """The fields before the first event: id, name, timestamp (writers put them first: field order)."""
        for number, wire, at, size, data in self._fields(line.offset, line.offset + line.length, {2, 11}):
            if number == 4 and wire == 2:
                if line.events_at is None:
                    line.events_at = at - 1 - len(encode_varint(size))
                if line.name:
                    return  # the rest is events (and a display name, read with them when needed)
            elif number == 1 and wire == 0:
                line.id = _signed(read_varint(data, 0, len(data))[0])
            elif number == 2 and data is not None:
                line.name = data.decode(errors="replace")
            elif number == 11 and data is not None:
                line.display_name = data.decode(errors="replace")
            elif number == 3 and wire == 0:
                line.timestamp_ns = _signed(read_varint(data, 0, len(data))[0])

    def events(self, line: Line, block_bytes: int = BLOCK_BYTES) -> Iterator[Block]:
        """The line's events, a block of whole events at a time, headers decoded (see Block)."""
        if line.events_at is None:
            return
        pos, end = line.events_at, line.offset + line.length
        while pos < end:
            data = self._read(pos, min(block_bytes, end - pos))
            starts, stop = _walk(data, len(data))
            if starts:
                block, data = _decode(data, starts), None  # the block alone holds the bytes: freed with it
                yield block
                pos += stop
            elif data[0] == _EVENT_TAG:  # one event larger than a block: read it whole
                length, value_at = read_varint(self._read(pos, 11), 1, 11)
                if pos + value_at + length > end:
                    raise XSpaceError(f"an event at byte {pos} runs past the end of its line")
                block, data = _decode(self._read(pos, value_at + length), [0]), None
                yield block
                pos += value_at + length
            else:  # a field that is not an event (a trailing display name): step over it
                pos = self._after_field(pos, end)

    def _after_field(self, pos: int, end: int) -> int:
        for _, _, at, size, _ in self._fields(pos, end, set()):
            return at + size
        return end


def _walk(data: bytes, end: int) -> tuple[list[int], int]:
    """Start of each whole event field in data[:end], and where the walk stopped (the hot loop)."""
    starts = []
    append = starts.append
    pos, last = 0, end - 1
    while pos < last:
        length = data[pos + 1]
        if length < 0x80:
            nxt = pos + 2 + length
        else:
            try:
                length, after = read_varint(data, pos + 1, end)
            except XSpaceError:
                break
            nxt = after + length
        if nxt > end or data[pos] != _EVENT_TAG:
            break
        append(pos)
        pos = nxt
    return starts, pos


def _varints(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values (uint64) and byte lengths of the varints starting at each position of `at`."""
    byte = buf[at]
    values = (byte & 0x7F).astype(np.uint64)
    size = np.ones(len(at), dtype=np.int64)
    going = np.flatnonzero(byte >= 0x80)
    shift = 7
    while len(going) and shift < 70:  # most varints here are one or two bytes: only the rest go on
        byte = buf[at[going] + size[going]]
        values[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        size[going] += 1
        going = going[byte >= 0x80]
        shift += 7
    return values, size


def _decode(data: bytes, starts_list: list[int]) -> Block:
    """Each event's metadata id, offset and duration: the first fields of its body, in field order."""
    buf = np.frombuffer(data + bytes(24), dtype=np.uint8)
    starts = np.asarray(starts_list, dtype=np.int64)
    length, size = _varints(buf, starts + 1)
    body = starts + 1 + size
    ends = body + length.astype(np.int64)
    out = {}
    cur = body
    for tag, name in ((0x08, "metadata_id"), (0x10, "offset_ps"), (0x18, "duration_ps")):
        has = (cur < ends) & (buf[np.minimum(cur, len(data))] == tag)
        values, size = _varints(buf, cur + 1)
        out[name] = np.where(has, values, 0).astype(np.uint64).view(np.int64)
        cur = np.where(has, cur + 1 + size, cur)
    nxt = buf[np.minimum(cur, len(data))]
    odd = (cur < ends) & (nxt != 0x22) & (nxt != 0x28)
    if odd.any():  # fields out of the usual order: let protobuf decode those events
        for i in np.flatnonzero(odd):
            event = parse_event(data[int(body[i]) : int(ends[i])])
            out["metadata_id"][i] = event.metadata_id
            out["offset_ps"][i] = event.offset_ps
            out["duration_ps"][i] = event.duration_ps
        cur = np.where(odd, body, cur)
    return Block(data, starts, ends, out["metadata_id"], out["offset_ps"], out["duration_ps"], cur)


def parse_event(raw: bytes):
    """An XEvent from its bytes (or the stats part of them, see Block.stats); XSpaceError when damaged."""
    try:
        return MESSAGES["XEvent"].FromString(raw)
    except Exception as error:  # upb's DecodeError: a damaged event
        raise XSpaceError(f"an event's bytes do not parse ({error})") from None


def _text(value) -> str:
    """A string field as text: protobuf hands bytes back for one that is not UTF-8 (a damaged name)."""
    return value if isinstance(value, str) else value.decode(errors="replace")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
