"""What tune reports: tune.md (every candidate), tune.png (the search at a glance), the printed summary."""

from __future__ import annotations

from pathlib import Path

import yaml

from train.benchmarks import charts
from train.benchmarks.report_writer import ReportWriter
from train.benchmarks.tune.overlay import flatten, per_s, train_command
from train.benchmarks.tune.search import fmt


def markdown(result: dict) -> str:
    lines = [
        "# make tune",
        "",
        f"Machine: **{result.get('machine', '?')}**. Dataset: {result.get('dataset', '?')}. "
        f"Scenario: {result.get('scenario', '?')}. Config: {result.get('config', '?')}.",
        "",
        f"Each candidate ran against the current best in {result['rounds']} interleaved rounds (warm-up excluded; "
        "the best measured twice per round for its A/A noise). Rule: " + result["rule"] + ".",
        "",
        "![search](tune.png)",
        "",
        f"| # | knob | from -> to | ratio vs best (quartiles) | A/A noise | needs | best {per_s(result)} | kept |",
        "|---|---|---|---:|---:|---:|---:|:---:|",
    ]
    for row in result["trials"]:
        step = f"{fmt(row['from'])} -> {fmt(row['value'])}"
        if "skipped" in row:
            lines.append(f"| {row['trial']} | {row['knob']} | {step} | skipped: {row['skipped']} | | | | |")
            continue
        lines.append(
            f"| {row['trial']} | {row['knob']} | {step} | x{row['gain']:.3f} ({row['q1']:.3f}-{row['q3']:.3f}) | "
            f"{row['noise']:.3f} | > {row['threshold']:.3f} | {row['best_rate']:,.0f} | "
            f"{'**yes**' if row['kept'] else 'no (' + row.get('verdict', 'within noise') + ')'} |"
        )
    stopped = {
        "done": "every candidate was tried",
        "budget": "the budget ran out",
        "interrupted": "interrupted (Ctrl-C)",
    }
    lines += [
        "",
        f"Search: {stopped.get(result['stopped'], result['stopped'])} after {result['search_seconds']:.0f} s.",
    ]
    final = result["final"]
    if final:
        lines += [
            "",
            f"Final check, tuned against start, {result['final_rounds']} rounds: start {final['start_rate']:,.0f} "
            f"{per_s(result)}, tuned {final['tuned_rate']:,.0f} {per_s(result)}, **x{final['gain']:.3f}** "
            f"(quartiles {final['q1']:.3f}-{final['q3']:.3f}, min-max {final['min']:.3f}-{final['max']:.3f}; "
            f"A/A noise {final['noise']:.3f}): "
            + ("faster beyond the noise." if final["faster"] else "not faster beyond the noise."),
        ]
        for name, row in final["against"].items():
            lines.append(f"tuned / {name} in the same rounds: x{row['median']:.3f}.")
    if result["overlay"]:
        lines += [
            "",
            f"Written to `{result['tuned_path']}`:",
            "",
            "```yaml",
            yaml.safe_dump(result["overlay"]).strip(),
            "```",
        ]
    if result["note"]:
        lines += ["", result["note"][0].upper() + result["note"][1:] + "."]
    return "\n".join(lines) + "\n"


def chart(result: dict, path: Path) -> None:
    """Each measured candidate's ratio against the best (median, quartile bar) with the bar it had to
    clear; kept green, not kept grey; the final check in blue. Below: the best's rate (per_s)."""
    plt = charts.pyplot()
    rows = [row for row in result["trials"] if "gain" in row]
    final = result["final"]
    labels = [f"{row['knob'].split('.')[-1]}={fmt(row['value'])}" for row in rows]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(8, 0.55 * (len(rows) + 2)), 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for index, row in enumerate(rows):
        colour = charts.KEPT if row["kept"] else charts.NOT_KEPT
        top.errorbar(
            index,
            row["gain"],
            yerr=[[row["gain"] - row["q1"]], [row["q3"] - row["gain"]]],
            fmt="o",
            color=colour,
            capsize=3,
        )
        top.plot([index - 0.3, index + 0.3], [row["threshold"]] * 2, color="#d62728", linewidth=1)
    if final:
        index = len(rows)
        labels.append("final: tuned / start")
        top.errorbar(
            index,
            final["gain"],
            yerr=[[final["gain"] - final["q1"]], [final["q3"] - final["gain"]]],
            fmt="s",
            color="#1f77b4",
            capsize=3,
        )
        top.plot([index - 0.3, index + 0.3], [final["threshold"]] * 2, color="#d62728", linewidth=1)
    top.axhline(1.0, color="black", linewidth=0.6)
    top.set_ylabel("ratio vs best (median, quartiles)")
    top.set_title(
        f"make tune - {result.get('machine', '')}\n"
        "green: kept, grey: not kept, blue: final check; red tick: the ratio a candidate had to beat",
        fontsize=9,
    )
    rates = [row["candidate_rate"] if row["kept"] else row["best_rate"] for row in rows]
    if final:
        rates.append(final["tuned_rate"])
    bottom.step(range(len(rates)), rates, where="mid", color="#1f77b4")
    bottom.set_ylabel(f"best {per_s(result)}")
    bottom.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=7)
    fig.tight_layout()
    charts.save(fig, path)


def summary(result: dict) -> str:
    measured = [row for row in result["trials"] if "gain" in row]
    kept = [row for row in measured if row["kept"]]
    lines = [
        f"{len(measured)} candidates measured ({result['stopped']}), {len(kept)} kept: "
        + (", ".join(f"{row['knob']}={fmt(row['value'])} (x{row['gain']:.2f})" for row in kept) or "none")
    ]
    final = result["final"]
    if final:
        lines.append(
            f"Final check: start {final['start_rate']:,.0f} {per_s(result)}, tuned {final['tuned_rate']:,.0f} "
            f"{per_s(result)}, "
            f"x{final['gain']:.3f} (quartiles {final['q1']:.3f}-{final['q3']:.3f}, A/A noise {final['noise']:.3f})"
        )
    if result["tuned_path"]:
        lines.append(
            f"Wrote {result['tuned_path']}: "
            + ", ".join(f"{k}={fmt(v)}" for k, v in flatten(result["overlay"]).items())
        )
        lines.append(f"Train with it: {train_command(result)}")
    if result["note"]:
        lines.append(result["note"][0].upper() + result["note"][1:] + ".")
    return "\n".join(lines)


WRITER = ReportWriter("tune", table=summary, markdown=markdown, chart=chart)
