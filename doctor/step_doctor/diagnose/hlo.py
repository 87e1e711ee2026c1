"""The shapes an XLA executable was compiled for, read from its HloProto without TensorFlow.

A profile's `/host:metadata` plane holds, for each XLA executable alive in the process, an
"Hlo Proto" stat: the compiled module (xla/service/hlo.proto). Its entry computation's parameter
shapes (HloModuleProto.host_program_shape) are the shapes the executable serves; a new shape of
the batch means a new executable, compiled again. Only the fields needed are walked, by number
(the generated classes are inside the TensorFlow wheel, which the analyser must not import):
HloProto.hlo_module = 1; HloModuleProto.host_program_shape = 4; ProgramShapeProto.parameters = 1;
ShapeProto.element_type = 2, dimensions = 3, tuple_shapes = 4 (xla/xla_data.proto).
"""

from __future__ import annotations

from collections.abc import Iterator

from step_doctor.diagnose import xspace

# xla_data.proto's PrimitiveType, as HLO text writes them (the rest print as "type<N>")
_TYPES = {1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64", 10: "f16"}
_TYPES.update({11: "f32", 12: "f64", 13: "tuple", 15: "c64", 16: "bf16", 17: "token", 18: "c128"})
_TUPLE = 13


class HloError(ValueError):
    """The bytes are not an HloProto this reader understands."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    return xspace.read_varint(buf, pos, len(buf), HloError)


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value): an int for varints, the bytes of a length-delimited field; others skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
            if pos > len(buf):
                raise HloError("a field runs past the end of its message")
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            continue
        else:
            raise HloError(f"unsupported wire type {wire}")
        yield number, wire, value


def _shape(buf: bytes) -> str:
    kind, dims, parts = 0, [], []
    for number, wire, value in _fields(buf):
        if number == 2 and wire == 0:
            kind = value
        elif number == 3 and wire == 0:
            dims.append(value)
        elif number == 3 and wire == 2:  # packed
            pos = 0
            while pos < len(value):
                dim, pos = _varint(value, pos)
                dims.append(dim)
        elif number == 4 and wire == 2:
            parts.append(_shape(value))
    if kind == _TUPLE:
        return "(" + ", ".join(parts) + ")"
    return f"{_TYPES.get(kind, f'type{kind}')}[{','.join(str(d) for d in dims)}]"


def _only(buf: bytes, number: int) -> list[bytes]:
    return [value for n, wire, value in _fields(buf) if n == number and wire == 2]


def parameter_shapes(hlo_proto: bytes) -> tuple[str, ...]:
    """The compiled shapes of the executable's parameters, in order: ("s32[32,128]", "s32[32]", "f32[2000,32]", ...)."""
    for module in _only(hlo_proto, 1):
        for program in _only(module, 4):
            return tuple(_shape(parameter) for parameter in _only(program, 1))
    return ()


def varying(shapes: list[tuple[str, ...]]) -> list[str]:
    """Per executable, the parameters whose shapes differ between the executables (the inputs that changed shape, not
    the weights), joined: ["s32[32,64] s32[32]", ...]; all of them where the executables have different arities."""
    if not shapes:
        return []
    if len({len(s) for s in shapes}) > 1:
        return [" ".join(s) for s in shapes]
    differ = [i for i in range(len(shapes[0])) if len({s[i] for s in shapes}) > 1]
    return [" ".join(s[i] for i in differ) for s in shapes] if differ else [" ".join(shapes[0][:2])] * len(shapes)
