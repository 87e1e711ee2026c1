"""A pipeline measured alone, without the model: what feeding the model costs the host."""

from __future__ import annotations

import time
from collections.abc import Callable


def pull(make_iterator: Callable, warm_batches: int, seconds: float, count: Callable) -> tuple:
    """Pull batches from a fresh iterator after `warm_batches` (caches filled) for at least `seconds`: (the sums
    of `count(batch)`'s figures, CPU seconds of every thread, wall seconds, memory growth in MB).

    Every thread of the process counts (process_time), so parallel stages are charged in full: CPU seconds per
    example x a device's examples/s is how many host cores it takes to feed that device."""
    import psutil

    process = psutil.Process()
    start_rss = process.memory_info().rss
    iterator = make_iterator()
    for _ in range(warm_batches):
        next(iterator)
    peak = process.memory_info().rss
    totals, batches, cpu, started = None, 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - started < seconds or batches < 5:
        counted = count(next(iterator))
        totals = counted if totals is None else tuple(a + b for a, b in zip(totals, counted))
        batches += 1
        if batches % 8 == 0:
            peak = max(peak, process.memory_info().rss)
    cpu, elapsed = time.process_time() - cpu, time.perf_counter() - started
    growth = (max(peak, process.memory_info().rss) - start_rss) / 2**20
    del iterator
    return totals, cpu, elapsed, growth
