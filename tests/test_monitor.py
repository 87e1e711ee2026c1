"""What the compare report says about utilization: NVML and GPM figures beside each other, n/a with the reason
where they were not sampled, never zero (a fake NVML, step_doctor_dev/fake_nvml.py, stands in where no GPU exists)."""

import json

import pytest

from step_doctor_dev.fake_nvml import fake_nvml
from train.benchmarks import report
from train.measure import monitor

# --- the compare report ---------------------------------------------------------------------


def run_summary(name: str, sampler: monitor.Sampler, rate: float, device: str) -> dict:
    """What summary.json holds for the report, with the sampler's real summary as `utilization`."""
    sampler.samples = [sampler.sample() for _ in range(4)]
    usage = sampler.summary()
    return {
        "name": name,
        "device": device,
        "device_kind": "gpu" if sampler.gpu_available else "cpu",
        "model": "tiny",
        "pipeline": f"{name} pipeline",
        "batch_size": 16,
        "choices": {"precision": "mixed_float16", "jit_compile": True, "steps_per_execution": 1},
        "examples_per_sec": rate,
        "step_time_ms": 1000 * 16 / rate,
        "input_bound_percent": 80.0 if name == "naive" else 2.0,
        "device_busy_percent": None,
        "val_accuracy": 0.5,
        "profile": None,
        "utilization": usage,
        "cpu_utilization_percent": usage["cpu_utilization_percent"]["mean"],
        "gpu_utilization_percent": usage["gpu_utilization_percent"],
    }


def drawn_chart(monkeypatch, out_dir, result) -> dict:
    """report.write, keeping what its chart drew: utilization panel tick labels, bar labels, notes."""
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    report.write(out_dir, result)
    panel = figures[0].axes[2]
    return {
        "ticks": [label.get_text() for label in panel.get_xticklabels()],
        "bar_labels": [text.get_text() for text in panel.texts],
        "notes": [text.get_text() for text in figures[0].texts if "n/a" in text.get_text()],
    }


def test_compare_report_shows_sm_activity_next_to_nvml_utilization(tmp_path, monkeypatch):
    runs = {
        name: run_summary(name, monitor.Sampler(nvml=fake_nvml(utilization=(util,))), rate, "1x NVIDIA H100")
        for name, util, rate in (("naive", 97, 1000.0), ("optimized", 99, 5000.0))
    }
    result = report.build(runs, scenario=None)
    drawn = drawn_chart(monkeypatch, tmp_path, result)

    saved = json.loads((tmp_path / "report.json").read_text())
    row = saved["runs"]["optimized"]
    assert row["gpu_utilization_percent"] == 99.0 and row["sm_activity_percent"] == 55.0
    assert row["sm_occupancy_percent"] == 31.5 and row["tensor_activity_percent"] == 20.0
    assert row["gpm_unavailable_reason"] is None

    lines = (tmp_path / "report.md").read_text().splitlines()
    labels = [line.split("|")[1].strip() for line in lines if line.startswith("| ")]
    at = labels.index("GPU utilization (NVML)")
    assert labels[at + 1 : at + 4] == [
        "SM activity (NVML GPM)",
        "SM occupancy (NVML GPM)",
        "tensor-core activity (NVML GPM)",
    ]
    assert "| SM activity (NVML GPM) | 55.0 % | 55.0 % |" in lines
    assert "| tensor-core activity (NVML GPM) | 20.0 % | 20.0 % |" in lines
    assert not any("n/a" in line for line in lines if "GPM" in line or "GPU" in line)

    at = drawn["ticks"].index("GPU util (NVML)")
    assert drawn["ticks"][at + 1 : at + 3] == ["SM activity (GPM)", "tensor cores (GPM)"]
    assert {"55", "20", "99"} <= set(drawn["bar_labels"]) and not drawn["notes"]
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert "SM activity (NVML GPM)" in report.table(result)


def test_compare_report_on_this_cpu_reads_n_a_with_the_reason_never_zero(tmp_path, monkeypatch):
    runs = {
        name: run_summary(name, monitor.Sampler(), rate, "CPU only")
        for name, rate in (("naive", 100.0), ("optimized", 400.0))
    }
    reason = runs["naive"]["utilization"]["gpm_unavailable_reason"]
    if runs["naive"]["utilization"]["gpu_available"]:
        pytest.skip("this machine has a GPU")
    result = report.build(runs, scenario=None)
    drawn = drawn_chart(monkeypatch, tmp_path, result)

    saved = json.loads((tmp_path / "report.json").read_text())
    for row in saved["runs"].values():
        assert row["sm_activity_percent"] is None and row["tensor_activity_percent"] is None
        assert row["gpm_unavailable_reason"] == reason and reason
    text = (tmp_path / "report.md").read_text()
    assert "| SM activity (NVML GPM) | n/a | n/a |" in text
    assert "| tensor-core activity (NVML GPM) | n/a | n/a |" in text
    assert f"SM occupancy, tensor-core activity) are n/a: {reason}." in text
    # device busy (no profile here), GPU util, SM activity, tensor cores: n/a for both runs
    assert drawn["bar_labels"].count("n/a") == 4 * 2
    assert any(reason in note for note in drawn["notes"])


def test_report_of_an_older_summary_without_gpm_figures_says_so():
    summary = run_summary("naive", monitor.Sampler(nvml=fake_nvml(utilization=(50,))), 100.0, "1x GPU")
    for key in ("gpm_unavailable_reason", *monitor.GPM_KEYS):
        del summary["utilization"][key]
    row = report.run_row(summary)
    assert row["sm_activity_percent"] is None and row["gpm_unavailable_reason"] == "not recorded by this run"
    assert report.run_row({**summary, "utilization": None})["gpm_unavailable_reason"] == report.NOT_SAMPLED
