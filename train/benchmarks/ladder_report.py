"""What `make ladder` writes: ladder.json, ladder.md (the table), ladder.png (a waterfall), TensorBoard hparams."""

from __future__ import annotations

from pathlib import Path

from train.benchmarks import charts
from train.benchmarks.report_writer import ReportWriter
from train.core import files


def write(out: Path, result: dict) -> None:
    WRITER.write(out, result)
    write_hparams(out, result)


def end_to_end_line(result: dict) -> str:
    end = result.get("end_to_end")
    if not end:
        return "End to end: no rung was kept."
    return (
        f"End to end, measured (the last kept rung, {end['top']}, against naive in the same rounds): "
        f"x{end['median']:.2f} (quartiles {end['q1']:.2f}-{end['q3']:.2f}; A/A noise {end['noise']:.3f}). "
        f"The product of the kept gains beyond the noise: x{result['final_speedup']:.2f}."
    )


def markdown_table(result: dict) -> str:
    lines = [
        f"| # | rung | {result.get('unit', 'examples/s')} (median, min-max) | gain vs previous (quartiles) "
        "| A/A noise | verdict | kept | input-bound | cumulative |",
        "|---|---|---:|---:|---:|---|---|---:|---:|",
        f"| 0 | naive | {result['naive_examples_per_sec'] or 0:,.0f} | | | | | | 1.00x |",
    ]
    for row in result["rungs"]:
        if "skipped" in row:
            lines.append(f"| {row['rung']} | {row['name']} | skipped: {row['skipped']} | | | | | | |")
            continue
        rate, verdict, share = row["examples_per_sec"], row["verdict"], row["input_bound_percent"]
        lines.append(
            f"| {row['rung']} | {row['name']} | {rate['median']:,.0f} ({rate['min']:,.0f}-{rate['max']:,.0f}) | "
            f"x{verdict['median']:.2f} ({verdict['q1']:.2f}-{verdict['q3']:.2f}) | {verdict['noise']:.3f} | "
            f"{verdict['verdict']} | {row['kept_text']} | {'n/a' if share is None else f'{share:.1f} %'} | "
            f"{row['cumulative_speedup']:.2f}x |"
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    return "\n".join(
        [
            "# Optimization ladder",
            "",
            f"Device: **{result['device']}**. {result['scenario']}. {result['trials']} paired, interleaved rounds "
            f"of at least {result['trial_seconds']:g} s per rung against the rung kept before it, both measured "
            "twice a round, alternating (the rung before it gives the A/A noise); warm-up excluded; every variant "
            "in its own process, stopped while another is measured. *gain* is the median of the per-round "
            "ratios against the previous rung; a rung is "
            "*faster* when that median is above 1 + max(3 %, A/A noise) and its lower quartile above 1, *slower* "
            "in the mirror case, else *within noise*. *cumulative* multiplies the kept gains beyond the noise "
            "(within noise counts x1.00). Input-bound shares come from a short profile of each rung (with "
            "steps_per_execution > 1 the steps are inferred from the executions).",
            "",
            "![waterfall](ladder.png)",
            "",
            markdown_table(result),
            "",
            end_to_end_line(result),
            "",
            "Why each rung: " + "; ".join(f"**{r['name']}**: {r['why']}" for r in result["rungs"]) + ".",
            "",
        ]
    )


def _bars(result: dict) -> list[tuple]:
    """(label, bottom, height, colour, hatch, note, input share) per bar of the waterfall."""
    level = result["naive_examples_per_sec"] or 0.0
    bars = [("naive", 0.0, level, "#7f7f7f", "", "", None)]
    for row in result["rungs"]:
        if "skipped" in row:
            bars.append((row["name"], level, 0.0, "#cccccc", "", "skipped", None))
            continue
        verdict = row["verdict"]["verdict"]
        reached = level * (1.0 if verdict == "within noise" else row["gain"])
        colour = {"faster": charts.KEPT, "slower": charts.SLOWER}.get(verdict, charts.WITHIN)
        note = (
            f"x{row['gain']:.2f}"
            + ("" if verdict != "within noise" else " (noise)")
            + ("" if row["kept"] else " not kept")
        )
        height = abs(reached - level) or level * 0.01
        bars.append(
            (
                row["name"],
                min(level, reached),
                height,
                colour,
                "" if row["kept"] else "//",
                note,
                row["input_bound_percent"],
            )
        )
        if row["kept"]:
            level = reached
    return bars


def chart(result: dict, path: Path) -> None:
    """A waterfall: each kept rung moves the level by its gain beyond the noise; within noise: a thin yellow bar."""
    plt = charts.pyplot()
    bars = _bars(result)
    fig, ax = plt.subplots(figsize=(max(9, 1.05 * len(bars)), 5))
    drawn = ax.bar(
        range(len(bars)),
        [b[2] for b in bars],
        bottom=[b[1] for b in bars],
        color=[b[3] for b in bars],
        edgecolor="black",
        linewidth=0.5,
    )
    for index, (bar, item) in enumerate(zip(drawn, bars)):
        bar.set_hatch(item[4])
        if item[5]:
            ax.text(index, item[1] + item[2], item[5], ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(f"{result.get('unit', 'examples/s')} (naive median x cumulative gain)")
    end = result.get("end_to_end")
    overall = f"x{end['median']:.1f} overall, measured end to end" if end else "no rung kept"
    ax.set_title(
        f"Optimization ladder - {result['device']} - {overall}\n"
        "green: faster, red: slower, yellow: within noise (hatched: not kept)",
        fontsize=9,
    )
    twin = ax.twinx()
    xs = [i for i, b in enumerate(bars) if b[6] is not None]
    twin.plot(xs, [bars[i][6] for i in xs], "o--", color="#1f77b4", label="waiting for input (% of step)")
    twin.set_ylim(0, 100)
    twin.set_ylabel("waiting for input, % of step time (profiler)")
    twin.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    charts.save(fig, path)


def write_hparams(out: Path, result: dict) -> None:
    """One TensorBoard session per rung with its knobs as hparams, for the HParams dashboard."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    for row in result["rungs"]:
        if "hparams" not in row:
            continue
        writer = files.scalar_writer(out / "tb" / f"{row['rung']:02d}_{row['name'].replace(' ', '_')}")
        with writer.as_default():
            hp.hparams({**row["hparams"], "rung": row["name"]}, trial_id=f"{row['rung']:02d}")
            tf.summary.scalar("ladder/examples_per_sec", row["examples_per_sec"]["median"], step=row["rung"])
            tf.summary.scalar("ladder/gain_vs_previous", row["gain"], step=row["rung"])
            if row["input_bound_percent"] is not None:
                tf.summary.scalar("ladder/input_bound_percent", row["input_bound_percent"], step=row["rung"])
        writer.close()


WRITER = ReportWriter("ladder", table=markdown_table, markdown=markdown, chart=chart)
