"""bench, ladder, sweep-batch and bench-check run end to end (on the tiny dataset, with short trials).

Speed itself is measured by `make bench`, not asserted here: these tests check that the
benchmarks measure what they say, write what they promise, and report their spread.
"""

import json
import statistics

import pytest
import yaml

from tests.conftest import ROOT, data_sets, run_cli
from train.benchmarks import ladder
from train.core.errors import UserError


def sets(tiny_data_dir, *extra):
    return [arg for item in data_sets(tiny_data_dir) + list(extra) for arg in ("--set", item)]


@pytest.mark.long
def test_bench_reports_paired_gains_the_decode_floor_and_the_cores_each_pipeline_needs(tiny_data_dir, tmp_path):
    out = tmp_path / "bench"
    result = run_cli(
        "bench",
        "--out",
        str(out),
        "--trials",
        "3",
        "--seconds",
        "0.2",
        *sets(tiny_data_dir, "pipeline.batch_size=16", "pipeline.shuffle_buffer=16"),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    bench = json.loads((out / "bench.json").read_text())
    assert set(bench["variants"]) == {"naive", "optimized", "ceiling", "service_1w", "service_2w"}
    assert set(bench["data_service"]) == {"service_1w", "service_2w"}
    assert "tf.data service" in bench["variants"]["service_2w"]["pipeline"]
    for row in bench["variants"].values():
        assert row["trials"] == 3 and len(row["samples"]) == 3
        assert row["min"] <= row["median"] <= row["max"]
    variants = bench["variants"]
    # headline figures are medians of per-round ratios (stats.py), not ratios of medians
    assert bench["speedup"] == pytest.approx(
        statistics.median(a / b for a, b in zip(variants["optimized"]["samples"], variants["naive"]["samples"]))
    )
    assert bench["efficiency"] == pytest.approx(
        statistics.median(a / b for a, b in zip(variants["optimized"]["samples"], variants["ceiling"]["samples"]))
    )
    assert bench["speedup_gain"]["q1"] <= bench["speedup"] <= bench["speedup_gain"]["q3"]
    assert len(bench["aa"]["ratios"]) == 3 and bench["noise"] >= 0  # optimized measured twice a round
    assert bench["device"] and "zero input cost" in variants["ceiling"]["pipeline"]
    floor = bench["decode_floor"]
    assert floor["core_seconds_per_example"] > 0 and "decode_jpeg" in floor["decode"]
    for name in ("naive", "optimized"):  # what feeding the device costs the host, against the floor
        cost = bench["pipeline_cost"][name]
        assert cost["core_seconds_per_example"] > 0 and cost["examples_per_sec_alone"] > 0
        assert cost["floor_multiple"] == pytest.approx(
            cost["core_seconds_per_example"] / floor["core_seconds_per_example"]
        )
        assert cost["cores_needed"]["3000"] == pytest.approx(3000 * cost["core_seconds_per_example"])
        assert cost["cores_to_feed_device"] == pytest.approx(
            cost["core_seconds_per_example"] * variants["ceiling"]["median"]
        )
    assert bench["snapshot"] is None  # the decoded images fit in memory: no snapshot on disk
    assert bench["host_cores"] >= 1 and bench["peak_rss_mb"] > 0
    assert "Decode floor" in (out / "bench.md").read_text()
    for text in ("cores per 1,000 images/s", "speedup (optimized / naive)", "Decode floor", "x floor"):
        assert text in result.stdout
    assert list((out / "tb" / "ceiling").glob("events.out.tfevents.*"))


@pytest.mark.long
def test_bench_measures_the_pipeline_auto_takes_without_the_snapshot_and_the_snapshots_cost(tiny_data_dir, tmp_path):
    """With a cache folder and decoded images over cache_limit_mb, auto takes a decoded snapshot on disk."""
    out = tmp_path / "bench"
    extra = ["pipeline.batch_size=16", "pipeline.shuffle_buffer=16", "pipeline.cache_limit_mb=0"]
    extra.append(f"pipeline.cache_dir={tmp_path / 'snapshots'}")
    result = run_cli(
        "bench",
        "--out",
        str(out),
        "--trials",
        "2",
        "--seconds",
        "0.2",
        "--data-service-workers",
        *sets(tiny_data_dir, *extra),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    bench = json.loads((out / "bench.json").read_text())
    assert set(bench["variants"]) == {"naive", "optimized", "ceiling", "without_snapshot"}
    assert "snapshot on disk" in bench["variants"]["optimized"]["pipeline"]
    without = bench["variants"]["without_snapshot"]["pipeline"]
    assert "snapshot" not in without and "map(decode" in without  # decodes every epoch
    snapshot = bench["snapshot"]
    assert snapshot["disk_mb"] > 0 and not snapshot["reused"] and snapshot["first_epoch_seconds"] > 0
    assert set(bench["pipeline_cost"]) == {"naive", "optimized", "without_snapshot"}
    assert "decoded snapshot in" in result.stdout


SHORT_LADDER = {
    "start": str(ROOT / "configs/naive.yaml"),
    "rungs": [
        {"name": "tfrecord", "set": {"pipeline.reader": "tfrecord", "pipeline.augment": "per_example"}},
        {"name": "cache", "set": {"pipeline.cache": "auto"}},
        {"name": "larger batch", "set": {"pipeline.batch_size": 64}},
        {"name": "XLA", "keep": "if_faster", "set": {"train.jit_compile": True}},
    ],
}


@pytest.mark.long
def test_ladder_turns_on_one_technique_per_rung_and_measures_the_end_to_end_gain(tiny_data_dir, tmp_path):
    out, rungs = tmp_path / "ladder", tmp_path / "ladder.yaml"
    rungs.write_text(yaml.safe_dump(SHORT_LADDER))
    result = run_cli(
        "ladder",
        "--ladder",
        str(rungs),
        "--out",
        str(out),
        "--trials",
        "3",
        "--seconds",
        "0.1",
        *sets(tiny_data_dir, "pipeline.shuffle_buffer=16"),
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "ladder.json").read_text())
    assert [row["name"] for row in report["rungs"]] == [rung["name"] for rung in SHORT_LADDER["rungs"]]
    for row, rung in zip(report["rungs"], SHORT_LADDER["rungs"]):
        verdict = row["verdict"]
        # 3 rounds, crossed: 2 a half, each paired with its counterpart (isolated.pair_round)
        assert verdict["verdict"] in ("faster", "slower", "within noise") and len(verdict["ratios"]) == 2
        assert row["gain"] == pytest.approx(statistics.median(verdict["ratios"]))
        assert row["kept"] == (rung.get("keep", "always") == "always" or verdict["verdict"] == "faster")
        # xprof finds no step markers inside a multi-step execution; the analysis then infers the steps
        # (step_doctor/diagnose/step_windows.py), so every rung has an input share
        assert row["input_bound_percent"] is not None
    assert report["final_speedup"] == pytest.approx(report["rungs"][-1]["cumulative_speedup"])
    end = report["end_to_end"]  # measured: the last kept rung against naive, in the same rounds
    last_kept = [row["name"] for row in report["rungs"] if row["kept"]][-1]
    assert end["top"] == last_kept and end["median"] > 0 and len(end["ratios"]) == 2
    assert report["rungs"][2]["batch_size"] == 64
    assert (out / "ladder.png").stat().st_size > 10_000
    assert "| # | rung |" in (out / "ladder.md").read_text() and "End to end, measured" in result.stdout
    assert len(list((out / "tb").iterdir())) == len(report["rungs"])


def test_the_shipped_ladders_name_an_order_check_rung():
    for path in (ROOT / "configs/ladder").glob("*.yaml"):
        rungs = ladder.load_ladder(path)
        assert rungs["order_check"] in [rung["name"] for rung in rungs["rungs"]], path


def test_ladder_file_is_validated(tmp_path):
    bad = tmp_path / "ladder.yaml"
    bad.write_text("start: naive.yaml\nrungs:\n  - name: x\n    sett: {pipeline.prefetch: auto}\n")
    with pytest.raises(UserError, match="needs 'name' and a 'set' mapping"):
        ladder.load_ladder(bad)
    bad.write_text("start: naive.yaml\norder_check: nope\nrungs:\n  - name: x\n    set: {pipeline.prefetch: auto}\n")
    with pytest.raises(UserError, match="order_check 'nope' is not a rung"):
        ladder.load_ladder(bad)


@pytest.mark.long
def test_sweep_finds_the_largest_batch_that_fits(tiny_data_dir, tmp_path):
    out = tmp_path / "sweep"
    result = run_cli(
        "sweep-batch",
        "--out",
        str(out),
        "--min",
        "16",
        "--max",
        "1024",
        "--trials",
        "2",
        "--seconds",
        "0.1",
        *sets(tiny_data_dir, "pipeline.shuffle_buffer=16"),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["batch_size"] for p in sweep["points"]] == [16, 32, 64, 128]
    assert sweep["largest_batch_that_fit"] == 128
    assert "larger than the training split" in sweep["stopped_because"]
    assert all(p["examples_per_sec"]["median"] > 0 and p["input_bound_percent"] is not None for p in sweep["points"])
    assert (out / "sweep.png").exists()


@pytest.mark.long
def test_the_ladders_distribution_rung_really_distributes_over_two_logical_cpus(tiny_data_dir, tmp_path):
    rungs = tmp_path / "ladder.yaml"
    rungs.write_text(
        yaml.safe_dump(
            {
                "start": str(ROOT / "configs/naive.yaml"),
                "rungs": [
                    {
                        "name": "distribution",
                        "needs_devices": 2,
                        "set": {"train.strategy": "mirrored", "train.cpu_replicas": 2},
                    }
                ],
            }
        )
    )
    out = tmp_path / "ladder"
    result = run_cli(
        "ladder",
        "--ladder",
        str(rungs),
        "--out",
        str(out),
        "--trials",
        "2",
        "--seconds",
        "0.2",
        *sets(tiny_data_dir, "pipeline.batch_size=8", "pipeline.shuffle_buffer=16"),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (row,) = json.loads((out / "ladder.json").read_text())["rungs"]
    assert "skipped" not in row
    assert row["strategy"] == "mirrored" and row["replicas"] == 2
    assert row["batch_size"] == 16  # 8 per replica, global batch derived from the strategy
    assert row["previous_examples_per_sec"]["median"] > 0 and row["examples_per_sec"]["median"] > 0
    assert "over 2 replicas" in row["pipeline"]


@pytest.mark.long
def test_compare_keeps_a_failed_runs_exit_3_instead_of_calling_it_a_config_error(tiny_data_dir, tmp_path):
    # A stall watchdog of 10 ms fires during the first (compiling) step: the run fails with exit 3.
    result = run_cli(
        "compare",
        "--out",
        str(tmp_path / "compare"),
        *sets(tiny_data_dir, "train.stall_timeout_s=0.01", "pipeline.batch_size=16", "train.epochs=1"),
        timeout=600,
    )
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Training configs/naive.yaml failed (exit 3)" in result.stderr


def test_every_benchmark_writes_its_report_through_one_writer_shape(tmp_path):
    from train.benchmarks import bench_report, ladder_report, report, report_writer, sweep
    from train.benchmarks.tune import report as tune_report

    writers = {m.WRITER.name: m.WRITER for m in (report, bench_report, ladder_report, sweep, tune_report)}
    assert set(writers) == {"report", "bench", "ladder", "sweep", "tune"}
    assert all(isinstance(w, report_writer.ReportWriter) and callable(w.table) for w in writers.values())

    def chart(result, path):
        path.write_bytes(b"png")

    writer = report_writer.ReportWriter("demo", table=str, markdown=lambda r: f"# {r['x']}\n", chart=chart)
    written = writer.write(tmp_path, {"x": 1})
    assert [p.name for p in written] == ["demo.json", "demo.md", "demo.png"]
    assert (
        json.loads((tmp_path / "demo.json").read_text()) == {"x": 1} and (tmp_path / "demo.md").read_text() == "# 1\n"
    )
    table = sweep.table(
        {
            "unit": "examples/s",
            "points": [
                {"batch_size": 32, "examples_per_sec": {"median": 1234.5}, "status": "ok"},
                {"batch_size": 64, "status": "oom"},
            ],
        }
    )
    assert "1,234" in table and "oom" in table
