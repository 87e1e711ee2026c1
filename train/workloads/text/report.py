"""What the reports show of a text run and a text bench: real tokens, padding, shapes and compiles (compare),
each pipeline's CPU time per real token (bench). They read the JSON runs and benchmarks wrote."""

from __future__ import annotations

ROWS = (  # compare's rows before the shared ones: (label, key in the run's row, decimals, unit)
    ("real (non-padding) tokens/s", "real_tokens_per_s", 0, ""),
    ("padded slots/s", "padded_slots_per_s", 0, ""),
    ("padding share", "padding_share_percent", 1, " %"),
    ("distinct input shapes", "distinct_shapes", 0, ""),
    ("texts per step", "texts_per_step", 1, ""),
    ("XLA compiles", "xla_compiles", 0, ""),
    ("compile seconds (XLA)", "compile_seconds", 1, ""),
)


def row(summary: dict, steps_per_execution: int | None) -> dict:
    """compare: a run's text figures (summary.json's `text`) as row values."""
    text = summary.get("text")
    if not text:
        return {}
    off = "XLA off"
    share = text.get("padding_share")
    return {
        "real_tokens_per_s": text.get("real_tokens_per_s"),
        "padded_slots_per_s": text.get("padded_slots_per_s"),
        "padding_share_percent": None if share is None else 100 * share,
        "distinct_shapes": text.get("distinct_shapes"),
        "texts_per_step": text.get("texts_per_step"),
        # the profile's step breakdown per 1,000 real tokens: text steps differ in the texts they hold
        "examples_per_profiled_step": (text.get("real_tokens_per_step") or 0) / 1000 * (steps_per_execution or 1)
        or None,
        "xla_compiles": text.get("xla_compiles") if text.get("jit_compile") else off,
        "compile_seconds": text.get("compile_seconds") if text.get("jit_compile") else off,
        "shapes": text.get("shapes"),
    }


def shapes_lines(report: dict) -> list[str]:
    names = list(report["runs"])
    lines = ["", "Input shapes (rows x length) each run trained on:", ""]
    return lines + [f"- **{n}**: {', '.join(report['runs'][n].get('shapes') or []) or 'n/a'}" for n in names]


def bar_label(value: float, row: dict) -> str:
    share = row.get("padding_share_percent")
    shapes = row.get("distinct_shapes")
    return f"{value:,.0f}\n{'n/a' if share is None else f'{share:,.0f} %'} padding, {shapes} shape" + (
        "" if shapes == 1 else "s"
    )


def cost_lines(result: dict) -> list[str]:
    """bench: each text pipeline's CPU cost per real token, and the cores it takes to feed the model at its ceiling."""
    ceiling = result["variants"]["ceiling"]["median"]
    lines = [
        f"{'pipeline alone':<17}{'tokens/s alone':>15}{'texts/s alone':>15}{'core-us/token':>15}{'cores/100k/s':>14}"
    ]
    for name, cost in result["pipeline_cost"].items():
        lines.append(
            f"{name:<17}{cost['real_tokens_per_sec_alone']:>15,.0f}{cost['texts_per_sec_alone']:>15,.0f}"
            f"{cost['core_seconds_per_token'] * 1e6:>15.3f}{cost['cores_per_100k_tokens']:>14.2g}"
        )
    for name, cost in result["pipeline_cost"].items():
        lines.append(
            f"{name}: the model here eats {ceiling:,.0f} real tokens/s: {cost['cores_to_feed_device']:.2g} cores to "
            f"feed it (this host has {result['host_cores']}); memory +{cost['memory_growth_mb']:,.0f} MB"
        )
    lines.append(f"peak RSS of the largest variant's process: {result['peak_rss_mb']:,.0f} MB")
    return lines
