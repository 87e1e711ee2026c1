"""bench, ladder and sweep-batch run end to end (on the tiny dataset, with short trials).

Speed itself is measured by `make bench`, not asserted here: these tests check that the
benchmarks measure what they say, write what they promise, and report their spread.
"""

import json

import pytest
import yaml

from tests.conftest import ROOT, data_sets, run_cli
from train.benchmarks import ladder
from train.core.errors import UserError


def sets(tiny_data_dir, *extra):
    return [arg for item in data_sets(tiny_data_dir) + list(extra) for arg in ("--set", item)]


@pytest.mark.slow
def test_bench_reports_medians_spreads_speedup_and_efficiency(tiny_data_dir, tmp_path):
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
    assert bench["speedup"] == pytest.approx(
        bench["variants"]["optimized"]["median"] / bench["variants"]["naive"]["median"]
    )
    assert bench["efficiency"] == pytest.approx(
        bench["variants"]["optimized"]["median"] / bench["variants"]["ceiling"]["median"]
    )
    assert bench["speedup_range"][0] <= bench["speedup_range"][1]
    assert bench["device"] and "zero input cost" in bench["variants"]["ceiling"]["pipeline"]
    for name in ("naive", "optimized"):  # what feeding the device costs the host
        cost = bench["pipeline_cost"][name]
        assert cost["core_seconds_per_example"] > 0 and cost["examples_per_sec_alone"] > 0
        assert cost["cores_to_feed_device"] == pytest.approx(
            cost["core_seconds_per_example"] * bench["variants"]["ceiling"]["median"]
        )
    assert bench["host_cores"] >= 1 and bench["peak_rss_mb"] > 0
    assert "cores per 1,000 images/s" in result.stdout
    assert "speedup (optimized / naive, medians)" in result.stdout
    assert list((out / "tb" / "ceiling").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_ladder_turns_on_one_technique_per_rung(tiny_data_dir, tmp_path):
    out = tmp_path / "ladder"
    # 512 training examples, so that the ladder's batch of 256 fits
    result = run_cli(
        "ladder",
        "--out",
        str(out),
        "--trials",
        "2",
        "--seconds",
        "0.1",
        *sets(tiny_data_dir, "data.num_train=512", "pipeline.shuffle_buffer=16"),
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "ladder.json").read_text())
    rungs = yaml.safe_load((ROOT / "configs/ladder/ladder.yaml").read_text())["rungs"]
    assert [row["name"] for row in report["rungs"]] == [rung["name"] for rung in rungs]
    for row, rung in zip(report["rungs"], rungs):
        if rung.get("needs_devices", 1) > 1:
            assert "needs 2 devices" in row["skipped"]
            continue
        assert row["gain"] > 0 and row["gain_range"][0] <= row["gain"] <= row["gain_range"][1]
        assert row["kept"] == (rung.get("keep", "always") == "always" or row["gain"] > 1.0)
        # xprof finds no step markers inside a multi-step execution; the analysis then infers the steps
        # (train/diagnose/step_windows.py), so every rung has an input share
        assert row["input_bound_percent"] is not None
    by_name = {row["name"]: row for row in report["rungs"]}
    assert by_name["larger batch"]["batch_size"] == 256
    assert by_name["mixed precision"]["precision"] in ("mixed_bfloat16", "mixed_float16")
    assert (out / "ladder.png").stat().st_size > 10_000
    assert "| # | rung |" in (out / "ladder.md").read_text()
    assert len(list((out / "tb").iterdir())) == sum(1 for row in report["rungs"] if "skipped" not in row)


def test_ladder_file_is_validated(tmp_path):
    bad = tmp_path / "ladder.yaml"
    bad.write_text("start: naive.yaml\nrungs:\n  - name: x\n    sett: {pipeline.prefetch: auto}\n")
    with pytest.raises(UserError, match="needs 'name' and a 'set' mapping"):
        ladder.load_ladder(bad)


@pytest.mark.slow
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


@pytest.mark.slow
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
