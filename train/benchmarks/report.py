"""The comparison report: report.json, report.md, report.png and a printed table.

It reads only what runs wrote (their summary.json), so it works on runs made elsewhere.
Next to NVML's "GPU utilization" (the share of time any kernel ran) it shows SM activity,
SM occupancy and tensor-core activity where the GPU reports them (NVML GPM, Hopper and
newer), and "n/a" with the reason where it does not, never 0.
"""

from __future__ import annotations

from pathlib import Path

from step_doctor import compare_rows
from train import workloads
from train.benchmarks import charts, stats
from train.benchmarks.report_writer import ReportWriter

FIELDS = (
    "examples_per_sec",
    "step_time_ms",
    "input_bound_percent",
    "device_busy_percent",
    "gpu_utilization_percent",
    "cpu_utilization_percent",
    "val_accuracy",
)
GPM_FIELDS = ("sm_activity_percent", "sm_occupancy_percent", "tensor_activity_percent")  # from summary["utilization"]
BREAKDOWN = (  # (summary key inside profile, label, colour)
    ("input_ms", "waiting for input", "#d62728"),
    ("host_compute_ms", "host compute", "#1f77b4"),
    ("device_compute_ms", "device compute", "#2ca02c"),
    ("kernel_launch_ms", "kernel launch", "#ff7f0e"),
    ("other_ms", "other", "#7f7f7f"),
)


NOT_SAMPLED = "utilization was not sampled (monitor.enabled: false)"


def run_row(summary: dict) -> dict:
    row = {key: summary.get(key) for key in FIELDS}
    utilization = summary.get("utilization") or {}
    row.update({key: utilization.get(key) for key in GPM_FIELDS})
    profile = summary.get("profile") or {}
    row.update(
        pipeline=summary.get("pipeline"),
        batch_size=summary.get("global_batch_size") or summary.get("batch_size"),
        # xprof's "step" is one execution: steps_per_execution batches of the global batch
        examples_per_profiled_step=(summary.get("global_batch_size") or summary.get("batch_size") or 1)
        * ((summary.get("choices") or {}).get("steps_per_execution") or 1),
        model=summary.get("model"),
        precision=summary.get("choices", {}).get("precision"),
        jit_compile=summary.get("choices", {}).get("jit_compile"),
        steps_per_execution=summary.get("choices", {}).get("steps_per_execution"),
        step_breakdown_ms={key: profile.get(key) for key, _, _ in BREAKDOWN}
        if profile.get("has_step_markers")
        else None,
        slow_stage=(profile.get("slow_stages") or [{}])[0].get("stage"),
        gpu_unavailable_reason=utilization.get("gpu_unavailable_reason") if utilization else NOT_SAMPLED,
        gpm_unavailable_reason=utilization.get("gpm_unavailable_reason", "not recorded by this run")
        if utilization
        else NOT_SAMPLED,
        run_dir=summary.get("run_dir"),
    )
    row.update(workloads.of_record(summary).report_row(summary))  # the workload's own figures
    return row


def build(runs: dict[str, dict], scenario: str | None, baseline: str = "naive", target: str = "optimized") -> dict:
    rows = {name: run_row(summary) for name, summary in runs.items()}
    first = next(iter(runs.values()))
    workload = workloads.of_record(first)
    key = workload.unit.key  # what the speedup counts (text: real tokens/s, the work done)
    base, best = rows[baseline].get(key), rows[target].get(key)
    return {
        "workload": workload.name,
        "unit": workload.unit.label,
        "speedup_of": key,
        "device": first.get("device"),
        "device_kind": first.get("device_kind"),
        "scenario": scenario,
        "dataset": first.get("dataset"),
        "model": first.get("model"),
        "speedup": stats.ratio(best, base),  # one run each, not paired rounds: make bench pairs them
        "runs": rows,
    }


ROWS = compare_rows.ROWS  # (label, key in the run's row, decimals, unit): the Diagnose tab shows the same


def rows_of(report: dict) -> tuple:
    """The workload's own rows (text: real tokens, padding, shapes, compiles), then the shared ones."""
    return workloads.of_record(report).report_rows + ROWS


def _speedup_unit(report: dict) -> str:
    return report.get("unit") or workloads.of_record(report).unit.label


def table(report: dict) -> str:
    names = list(report["runs"])
    rows = rows_of(report)
    width = max(len(label) for label, *_ in rows) + 2
    lines = ["".ljust(width) + "".join(name.rjust(16) for name in names)]
    for label, key, digits, suffix in rows:
        cells = [compare_rows.cell(report["runs"][n].get(key), digits, suffix).rjust(16) for n in names]
        lines.append(label.ljust(width) + "".join(cells))
    if report["speedup"]:
        lines.append(f"speedup ({names[-1]} / {names[0]} {_speedup_unit(report)}): {report['speedup']:.2f}x")
    return "\n".join(lines)


def na_notes(report: dict) -> list[str]:
    """Why GPU figures read n/a: the sampler's reasons, one sentence each."""
    runs = report["runs"].values()
    gpu = sorted({r.get("gpu_unavailable_reason") for r in runs} - {None})
    gpm = sorted({r.get("gpm_unavailable_reason") for r in runs} - {None} - set(gpu))
    notes = []
    if gpu:
        what = "NVML utilization, SM activity, SM occupancy, tensor-core activity"
        notes.append(f"GPU figures ({what}) are n/a: {'; '.join(gpu)}.")
    if gpm:
        notes.append(f"SM activity, SM occupancy and tensor-core activity (NVML GPM) are n/a: {'; '.join(gpm)}.")
    return notes


def markdown(report: dict) -> str:
    names = list(report["runs"])
    out = [
        "# Naive vs optimized input pipeline",
        "",
        f"Device: **{report['device']}**. Model: `{report['model']}`."
        + (f" Scenario: {report['scenario']}." if report["scenario"] else ""),
        "",
        "![throughput, step-time breakdown, utilization](report.png)",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for label, key, digits, suffix in rows_of(report)[:-1] + (
        ("precision / XLA / steps per execution", None, 0, ""),
        compare_rows.SLOWEST_STAGE,
    ):
        if key is None:
            cells = [
                f"{r['precision']} / {r['jit_compile']} / {r['steps_per_execution']}"
                for r in (report["runs"][n] for n in names)
            ]
        else:
            cells = [compare_rows.cell(report["runs"][n].get(key), digits, suffix) for n in names]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    if report["speedup"]:
        out += ["", f"**Speedup: {report['speedup']:.2f}x** {_speedup_unit(report)} ({names[-1]} / {names[0]})."]
    out += ["", "Pipelines:", ""]
    out += [f"- **{n}**: {report['runs'][n]['pipeline']}" for n in names]
    out += workloads.of_record(report).report_lines(report)
    notes = na_notes(report)
    if notes:
        out += [""] + notes
    out += [
        "",
        "Open the profiles: `make tensorboard`, then the Profile tab (runs `compare/<name>`), "
        "tools *input_pipeline_analyzer* and *trace_viewer*. Diagnose them: "
        "`make diagnose LOGDIR=runs/compare`.",
        "",
    ]
    return "\n".join(out)


CHART_METRICS = (  # (key in the run's row, bar label) of the utilization panel
    ("input_bound_percent", "waiting for input"),
    ("device_busy_percent", "device busy"),
    ("gpu_utilization_percent", "GPU util (NVML)"),
    ("sm_activity_percent", "SM activity (GPM)"),
    ("tensor_activity_percent", "tensor cores (GPM)"),
    ("cpu_utilization_percent", "CPU util"),
)


def chart(report: dict, path: Path) -> None:
    plt = charts.pyplot()
    names = list(report["runs"])
    runs = [report["runs"][n] for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))

    ax = axes[0]
    key = report.get("speedup_of") or "examples_per_sec"
    unit = _speedup_unit(report)
    values = [r.get(key) or 0 for r in runs]
    bars = ax.bar(names, values, color=["#d62728", "#2ca02c", "#1f77b4", "#9467bd"][: len(names)])
    workload = workloads.of_record(report)
    labels = [workload.bar_label(v, r) for v, r in zip(values, runs)]
    ax.bar_label(bars, labels=labels, fontsize=8)
    ax.set_ylim(0, max(values + [1]) * 1.2)  # room for the labels under the title
    ax.set_title(f"Throughput ({unit})" + (f" - {report['speedup']:.1f}x" if report["speedup"] else ""))
    ax.set_ylabel(unit.replace("/s", " / second"))

    ax = axes[1]
    bottoms = [0.0] * len(runs)
    for key, label, colour in BREAKDOWN:
        heights = [
            ((r["step_breakdown_ms"] or {}).get(key) or 0.0) / (r["examples_per_profiled_step"] or 1) * 1000
            for r in runs
        ]
        if any(heights):
            ax.bar(names, heights, bottom=bottoms, label=label, color=colour)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    per = workload.unit.per_step
    ax.set_title(f"Step time per {per}, by category (profiler)")
    ax.set_ylabel(f"microseconds per {per}")
    if ax.get_legend_handles_labels()[0]:  # runs without a profile draw no bars here
        ax.legend(fontsize=8)

    ax = axes[2]
    metrics = CHART_METRICS
    width = 0.8 / len(runs)
    for index, (name, run) in enumerate(zip(names, runs)):
        xs = [m + index * width for m in range(len(metrics))]
        heights = [run[key] if run[key] is not None else 0 for key, _ in metrics]
        bars = ax.bar(xs, heights, width=width, label=name)
        ax.bar_label(bars, labels=["n/a" if run[key] is None else f"{run[key]:.0f}" for key, _ in metrics], fontsize=7)
    ax.set_xticks(
        [m + width * (len(runs) - 1) / 2 for m in range(len(metrics))],
        [m[1] for m in metrics],
        fontsize=8,
        rotation=20,
        ha="right",
    )
    ax.set_ylim(0, 110)
    ax.set_title("Utilization (% of time)")
    ax.legend(fontsize=8)

    fig.suptitle(f"{report['device']} - model {report['model']}", fontsize=10)
    notes = na_notes(report)
    fig.tight_layout(rect=(0, 0.05 * len(notes), 1, 1))
    for index, note in enumerate(notes):
        fig.text(0.01, 0.01 + 0.04 * index, note, fontsize=7, wrap=True)
    charts.save(fig, path)


WRITER = ReportWriter("report", table=table, markdown=markdown, chart=chart)


def write(out_dir: Path, report: dict) -> None:
    WRITER.write(out_dir, report)
