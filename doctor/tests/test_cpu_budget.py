"""The cores' budget the estimates keep within (diagnose/cpu_budget.py), on figures written here.

What each fix gains is measured by `profile --prove` (test_prove.py, `make bench-prove`); these tests pin
the arithmetic the estimates rest on: a busy host gains nothing from overlap, removing work frees the cores
it took, fixes on one stage are not counted twice, and a record beside the profile is read or refused.
"""

from __future__ import annotations

import json

import pytest

from step_doctor.diagnose import input_causes
from step_doctor.diagnose.cpu_budget import Budget, ProcessCpu
from step_doctor.diagnose.recommendation import Causes, gain
from tests import records


def busy_host() -> Budget:
    # a 10 ms step on 2 cores using 19 of their 20 core-ms: 6 ms of it waits for a map whose calls ran 14 core-ms
    return Budget(step_ms=10.0, rest_ms=4.0, cores=2, core_ms=19.0, measured=True, traced_ms=18.0)


def test_on_a_busy_host_overlap_gains_nothing_and_removing_work_gains_the_cores_it_frees():
    budget = busy_host()
    assert budget.saturated
    assert budget.step_after(wait_ms=6.0) == pytest.approx(9.5)  # the cores bound it: 19 core-ms over 2
    after = budget.step_after(wait_ms=6.0, work_ms=14.0)  # a cache after the map
    assert after == pytest.approx((19.0 - 14.0) / 2)  # the rest speeds up too, to what the cores leave
    assert gain(10.0, budget.removes(6.0, 14.0)) == pytest.approx(4.0, abs=0.01)


def test_on_an_idle_host_the_wait_removed_is_the_gain():
    idle = Budget(step_ms=10.0, rest_ms=4.0, cores=2, core_ms=8.0, measured=True)  # a sleeping Python function
    assert not idle.saturated
    assert idle.step_after(wait_ms=6.0) == pytest.approx(4.0)
    assert idle.removes(6.0) == pytest.approx(6.0) and idle.removes(6.0).wait_ms == 6.0


def test_traced_work_beyond_the_process_cpu_is_deflated_and_a_device_bounds_the_step():
    budget = Budget(step_ms=10.0, rest_ms=4.0, cores=2, core_ms=18.0, measured=True, traced_ms=24.0)
    assert budget.deflation == pytest.approx(0.75)  # threads timed while they waited for a core
    assert budget.step_after(wait_ms=6.0, work_ms=16.0) == pytest.approx((18.0 - 12.0) / 2)
    unmeasured = Budget(step_ms=10.0, rest_ms=4.0, cores=2, core_ms=18.0, measured=False, traced_ms=24.0)
    assert unmeasured.deflation == 1.0  # a lower bound from the trace itself deflates nothing
    on_gpu = Budget(step_ms=10.0, rest_ms=4.0, cores=8, core_ms=20.0, measured=True, floor_ms=7.0)
    assert on_gpu.step_after(wait_ms=6.0) == pytest.approx(7.0)


def test_fixes_of_one_stage_count_once_and_fixes_of_several_add_up_within_the_input_wait():
    budget = busy_host()
    one_stage = budget.together([("map", 3.0, 0.0, False), ("map", 6.0, 14.0, True)], input_ms=6.0)
    assert one_stage == pytest.approx(budget.removes(6.0, 14.0))
    per_step = budget.together([("map", 6.0, 14.0, True), (None, 1.0, 1.0, False)], input_ms=6.0)
    assert per_step == pytest.approx(budget.removes(7.0, 15.0))
    capped = budget.together([("a", 5.0, 0.0, False), ("b", 5.0, 0.0, False)], input_ms=6.0)
    assert capped.wait_ms == 6.0
    # a cache of an outer map counts the inner stages' wait and work already (Blame.cached): the inner fix's once
    cached = budget.together([("Root::Map", 4.0, 10.0, True), ("Root::Map::FlatMap", 1.5, 4.0, False)], input_ms=6.0)
    assert (cached.wait_ms, cached.work_ms) == (4.0, 10.0)
    # a fix of the outer map's own work (per-batch augmentation) leaves the inner one's to count
    own = budget.together([("Root::Map", 3.0, 10.0, False), ("Root::Map::Map", 1.5, 4.0, False)], input_ms=6.0)
    assert (own.wait_ms, own.work_ms) == (4.5, 14.0)


def test_the_process_cpu_beside_a_profile_is_read_and_a_broken_one_is_refused(tmp_path):
    session = tmp_path / "run" / "plugins" / "profile" / "2026_12_05"
    session.mkdir(parents=True)
    assert ProcessCpu.beside(session) is None
    record = tmp_path / "run" / "process_cpu.json"
    record.write_text(json.dumps({"version": 1, "wall_s": 0.5, "cpu_s": 0.8, "cores": 2, "host_cores": 2}))
    cpu = ProcessCpu.beside(session)
    assert cpu.utilization == pytest.approx(0.8) and cpu.to_json()["utilization"] == 0.8
    for broken in ("{", json.dumps({"wall_s": 0, "cpu_s": 1, "cores": 2}), json.dumps({"cpu_s": 1})):
        record.write_text(broken)
        assert ProcessCpu.beside(session) is None


def _files_read_one_after_another(ops_ms: dict, opener_ops: dict | None = None) -> tuple:
    """many_files_sequential's figures as profiled: a parallel parse map over GZIP shards read one after another,
    its 23.8 ms of input wait mostly on the reader (18.0 ms) under the map (4.8 ms)."""
    top = tuple(sorted(ops_ms.items(), key=lambda item: -item[1]))
    parse = records.functions(work_ms=5.3, wall_ms=4.8, concurrency=1.0, threads=2, ops_ms=ops_ms, top_ops=top)
    opener = records.functions(work_ms=0.16, wall_ms=0.16, ops_ms=opener_ops or {})
    at = "Iterator::Root::Prefetch::MapAndBatch"
    tree = (
        records.stage("Iterator::Root", "Root", pass_through=True),
        records.stage("Iterator::Root::Prefetch", "Prefetch", pass_through=True, asynchronous=True),
        records.stage(at, "MapAndBatch", blocking_ms=4.8, functions=parse),
        records.stage(at + "::ForeverRepeat", "ForeverRepeat", pass_through=True, blocking_ms=0.1),
        records.stage(
            at + "::ForeverRepeat::FlatMap",
            "FlatMap",
            blocking_ms=0.7,
            functions=opener,
        ),
        records.stage(at + "::ForeverRepeat::FlatMap::TFRecord", "TFRecord", blocking_ms=18.0, busy_ms=23.5),
    )
    wait = records.wait(step_ms=31.8, input_ms=23.8, compute_ms=4.6, overhead_ms=3.2, cpu_budget=2, stages=tree)
    causes = Causes(31.8)
    input_causes.input_causes(wait, cpu_only=True, causes=causes)
    return at, causes.found


def test_a_cache_after_a_map_removes_the_wait_on_the_reads_under_it_too():
    """Counting the map's own wait alone, this cache was estimated x1.30 where prove measured x7.0."""
    at, found = _files_read_one_after_another({"decode": 3.0, "other": 2.0})
    (cache,) = [r for r in found if r.stage == at]
    wait, work, covers = cache.frees
    assert covers and wait == pytest.approx(4.8 + 0.16 + 18.0)  # the FlatMap's wait as far as its own work explains it
    assert work == pytest.approx(5.3 + 0.16 + 23.5)
    assert cache.estimated_gain >= 3.0
    # a map that draws at random cannot be cached: nothing removes the reads but reading them in parallel
    at, found = _files_read_one_after_another({"decode": 1.5, "augmentation": 0.2, "other": 3.3})
    assert all(not (r.estimates and "cache" in r.estimates) for r in found if r.stage == at)
    assert all(r.estimated_gain < 1.5 for r in found if r.stage == at)
    # nor one over a stage that draws: a cache would keep its draws. A decode split off the map and cached alone
    # removes the decode's share of the map's wait and work, not the reads
    at, found = _files_read_one_after_another({"decode": 3.0, "other": 2.0}, {"augmentation": 0.1})
    (decode,) = [r for r in found if r.stage == at]
    assert decode.cause == "decode-every-epoch" and "`.map(decode).cache().map(augment)`" in decode.fix
    assert decode.frees[:2] == pytest.approx((4.8 * 0.6, 5.3 * 0.6)) and not decode.frees[2]


def test_no_cache_is_offered_over_python_below_the_stage():
    """held-out lookup_in_map: a map that only checks shapes, over a sequential map whose numpy_function sleeps (a
    lookup in a store). A cache after the upper map would keep the lookup's answers, which the trace cannot say are
    fixed: counting the wait below, it was offered at x11.2."""
    python = records.functions(work_ms=19.6, wall_ms=19.6, ops_ms={"python": 19.0}, top_ops=(("PyFunc", 19.0),))
    at = "Iterator::Root::MapAndBatch"
    tree = (
        records.stage("Iterator::Root", "Root", pass_through=True),
        records.stage(
            at,
            "MapAndBatch",
            user_ops=("MapDataset",),
            blocking_ms=0.4,
            functions=records.functions(work_ms=0.39, wall_ms=0.39, ops_ms={"other": 0.39}),
        ),
        records.stage(at + "::Map", "Map", user_ops=("MapDataset",), blocking_ms=19.3, functions=python),
        records.stage(at + "::Map::ForeverRepeat", "ForeverRepeat", pass_through=True, blocking_ms=0.1),
        records.stage(at + "::Map::ForeverRepeat::TensorSlice", "TensorSlice", blocking_ms=0.2),
    )
    wait = records.wait(step_ms=22.2, input_ms=20.1, compute_ms=0.3, overhead_ms=1.8, cpu_budget=2, stages=tree)
    causes = Causes(22.2)
    input_causes.input_causes(wait, cpu_only=True, causes=causes)
    upper = [r for r in causes.found if r.stage == at]
    assert upper and all(not (r.estimates and "cache" in r.estimates) for r in upper)
    assert max(causes.found, key=lambda r: r.estimated_gain).cause == "python-in-map"
