"""Whether traceme_consume_fix.cc is in effect on the TensorFlow build at hand, read from its binary before it loads.

The fix works only if TensorFlow's framework library reaches the vector's growth function through its PLT (so that
a definition loaded earlier with RTLD_GLOBAL takes its place), calls no other growth function for the same vector,
and lays `ThreadEvents` out as the fix does. Each of those is read from the library's dynamic symbol table and its
PLT relocations, without importing TensorFlow (the fix must load before it does). A release that carries the
upstream fix (`result.reserve(...)` in `Consume()`, back in openxla/xla) needs no shim at all.

Standard library only (this runs inside the user's process, in whatever environment it has): a small ELF64
reader rather than pyelftools, which that environment may not have.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import mmap
import os
import struct

_VECTOR = "_ZNSt6vectorIN3tsl8profiler15TraceMeRecorder12ThreadEventsESaIS3_EE"
# What the shim replaces (the header of traceme_consume_fix.cc lists the same)
REALLOC_INSERT = _VECTOR + "17_M_realloc_insertIJS3_EEEvN9__gnu_cxx17__normal_iteratorIPS3_S5_EEDpOT_"
# libstdc++ 14 grows a vector on push_back through this one instead: a build that uses it bypasses the shim
REALLOC_APPEND = _VECTOR + "17_M_realloc_append"
# Consume() with the upstream fix calls reserve() before it fills the vector, so it never grows there
RESERVE = _VECTOR + "7reserveEm"
CONSUME = "_ZN3tsl8profiler15TraceMeRecorder7ConsumeEv"
NEW_STRING = "St7__cxx1112basic_string"  # std::__cxx11::basic_string: the new (C++11) string ABI
OLD_STRING = ("_ZNSs", "_ZNKSs")  # members of the old, copy-on-write std::string
# the checks in the order they run; a report names the first that failed
CHECKS = ("library", "elf", "consume", "plt-binding", "no-realloc-append", "string-abi")
JUMP_SLOT = {62: 7, 183: 1026}  # e_machine -> R_*_JUMP_SLOT: x86-64, AArch64
ANSWER_VERSION = 1  # bump when a check changes: cached answers of older checks are not reused
LIBRARY_NAMES = ("libtensorflow_framework.so.2", "libtensorflow_framework.so")


class NotElf(ValueError):
    pass


def framework_library() -> str | None:
    """The installed TensorFlow's framework library, found without importing TensorFlow."""
    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for name in LIBRARY_NAMES:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                return os.path.realpath(path)
    return None


def dynamic_symbols(path: str) -> tuple[set, set]:
    """(names in .dynsym, names that a PLT (JUMP_SLOT) relocation binds) of a little-endian ELF64 shared object."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise NotElf(f"{path} is not a little-endian 64-bit ELF file")
        machine = struct.unpack_from("<H", data, 18)[0]
        (shoff,) = struct.unpack_from("<Q", data, 40)
        shentsize, shnum = struct.unpack_from("<HH", data, 58)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        dynsym = next((i for i, s in enumerate(sections) if s[1] == 11), None)  # SHT_DYNSYM
        if dynsym is None:
            raise NotElf(f"{path} has no dynamic symbol table")
        _, _, _, _, sym_off, sym_size, strtab, _, _, sym_ent = sections[dynsym]
        str_off = sections[strtab][4]

        def name(index: int) -> str:
            start = str_off + struct.unpack_from("<I", data, sym_off + index * sym_ent)[0]
            return data[start : data.find(b"\0", start)].decode("ascii", "replace")

        names = [name(i) for i in range(sym_size // sym_ent)]
        jump_slot, bound = JUMP_SLOT.get(machine), set()
        for _, kind, _, _, off, size, link, _, _, ent in sections:
            if kind != 4 or link != dynsym or not ent:  # SHT_RELA against .dynsym
                continue
            for at in range(off, off + size - ent + 1, ent):
                info = struct.unpack_from("<Q", data, at + 8)[0]
                if info & 0xFFFFFFFF == jump_slot and info >> 32:
                    bound.add(names[info >> 32])
        return set(names), bound


def check(path: str | None) -> dict:
    """{"verdict": "fixable" | "fixed-upstream" | "refused", "check": the failed check or None, "why": text,
    "library": path, "passed": [checks]}: what the fix would do on the library at path."""
    passed = []

    def result(verdict: str, failed: str | None, why: str) -> dict:
        return {"verdict": verdict, "check": failed, "why": why, "library": path, "passed": passed}

    if not path or not os.path.exists(path):
        return result("refused", "library", "TensorFlow's framework library (libtensorflow_framework.so.2) is missing")
    passed.append("library")
    try:
        names, bound = dynamic_symbols(path)
    except (OSError, NotElf, struct.error, IndexError, ValueError) as error:
        return result("refused", "elf", f"its dynamic symbols could not be read ({error})")
    passed.append("elf")
    if CONSUME not in names:
        return result("refused", "consume", f"{path} does not export tsl::profiler::TraceMeRecorder::Consume()")
    passed.append("consume")
    if RESERVE in names:
        return result(
            "fixed-upstream",
            None,
            "Consume() reserves its vector before filling it (the upstream fix): the shim is not needed and not loaded",
        )
    if REALLOC_INSERT not in bound:
        where = "is not bound through the PLT" if REALLOC_INSERT in names else "is not in its dynamic symbols"
        return result(
            "refused",
            "plt-binding",
            f"std::vector<ThreadEvents>::_M_realloc_insert {where} in {os.path.basename(path)}: the build inlines "
            "or hides the vector's growth, so a shim cannot take its place",
        )
    passed.append("plt-binding")
    append = sorted(n for n in names if n.startswith(REALLOC_APPEND))
    if append:
        return result(
            "refused",
            "no-realloc-append",
            f"{os.path.basename(path)} also grows the vector through _M_realloc_append (libstdc++ 14 or newer), "
            "which the shim does not replace",
        )
    passed.append("no-realloc-append")
    old = any(n.startswith(OLD_STRING) for n in names)
    if old or not any(NEW_STRING in n for n in names):
        return result(
            "refused",
            "string-abi",
            f"{os.path.basename(path)} was built with the old std::string ABI (_GLIBCXX_USE_CXX11_ABI=0): its "
            "ThreadEvents is 96 bytes where the shim's is 120, and loading it would corrupt the heap",
        )
    passed.append("string-abi")
    return result("fixable", None, "the vector's growth is bound through the PLT, as the shim needs")


def cached_check(path: str | None, folder: str | None) -> dict:
    """check(path), remembered in folder by the library's path, size and modification time."""
    if not path or not folder:
        return check(path)
    try:
        stat = os.stat(path)
    except OSError:
        return check(path)
    key = hashlib.sha256(f"{ANSWER_VERSION}|{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    answer_path = os.path.join(folder, f"tf-binary-{key}.json")
    try:
        with open(answer_path) as handle:
            answer = json.load(handle)
        if answer.get("library") == path:
            return answer
    except (OSError, ValueError):
        pass
    answer = check(path)
    tmp = f"{answer_path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(answer, handle)
        os.replace(tmp, answer_path)
    except OSError:  # a folder we may read but not write (a prebuilt image's): the answer is simply not kept
        if os.path.exists(tmp):
            os.unlink(tmp)
    return answer
