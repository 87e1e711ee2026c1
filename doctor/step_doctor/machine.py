"""What machine a measurement ran on: every benchmark says which CPU, and whether it has bfloat16 units."""

from __future__ import annotations

import os
import platform

BF16_FLAGS = {"avx512_bf16", "amx_bf16"}


def cpu_model() -> str:
    """The processor's name (Linux /proc/cpuinfo), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_bf16() -> bool:
    """The CPU has bfloat16 units (AVX512_BF16 or AMX)."""
    return bool(cpu_flags() & BF16_FLAGS)


def cpu_record() -> dict:
    """The CPU a measurement ran on, as the benchmarks' reports write it."""
    return {"model": cpu_model(), "bf16_units": cpu_bf16(), "cores": os.cpu_count()}
