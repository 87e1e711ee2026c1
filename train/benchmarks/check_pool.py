"""`make bench-check ARGS="--pool DIR DIR ..."`: the A/A rounds of earlier bench-check runs, pooled pairing by pairing.

One run's A/A median rests on three crossed rounds (the ladder's and tune's pairings; bench's on five). Where a repeat
in one process varies by 0.10, that median moves by 2-3 % from run to run, so one run cannot tell whether a pairing
centres within 1 % of 1.00. Pooled over several runs of one machine (their check.json), each pairing gets the median
of all its crossed rounds and a 95 % interval of that median: a two-level bootstrap (the runs drawn with replacement,
then the rounds within each), so a run that read high as a whole widens the interval as it should, seeded so the same
files give the same figures. Each pairing then centres within 1 %: "yes" where the whole interval lies within
1.00 +-1 %, "no" where it lies wholly outside, else "cannot tell" (more runs, or a quieter machine). Measures nothing
and needs no TensorFlow; writes <out>/pooled.json and pooled.md.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from train.core import files
from train.core.errors import UserError

CENTRE = 0.01  # the ladder's and tune's A/A pairings should centre this close to 1.00 (issue 40)
DRAWS = 4000
SEED = 0


def read_runs(folders: list[Path]) -> list[dict]:
    """Each folder's check.json, all of one CPU (the runs of one machine kind pool; two kinds do not)."""
    runs = []
    for folder in folders:
        path = Path(folder) / "check.json"
        try:
            report = json.loads(path.read_text())
            scenarios = report["scenarios"]
            for name, result in scenarios.items():
                for pairing, aa in result["aa"].items():
                    if not aa.get("ratios"):
                        raise KeyError(f"scenarios.{name}.aa.{pairing}.ratios")
        except FileNotFoundError:
            raise UserError(
                f"bench-check --pool: {path} does not exist. Pass the --out folders of earlier `make bench-check` "
                "runs (runs/bench-check by default), each holding its check.json."
            ) from None
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise UserError(
                f"bench-check --pool: {path} is not a bench-check report ({type(error).__name__}: {error}). Pass the "
                "--out folders of `make bench-check` runs, whose check.json names each pairing's per-round ratios."
            ) from None
        runs.append({"folder": str(folder), "cpu": report.get("cpu") or {}, "scenarios": scenarios})
    kinds = {(run["cpu"].get("model"), run["cpu"].get("bf16_units")) for run in runs}
    if len(kinds) > 1:
        listed = "; ".join(f"{run['folder']}: {run['cpu'].get('model')}" for run in runs)
        raise UserError(
            f"bench-check --pool: the runs come from {len(kinds)} machine kinds ({listed}), and a bias belongs to a "
            "kind: pool the runs of one kind at a time."
        )
    return runs


def interval(groups: list[list[float]], draws: int = DRAWS, seed: int = SEED) -> tuple[float, float]:
    """95 % interval of the pooled median: runs drawn with replacement, then each drawn run's rounds."""
    rng = random.Random(seed)
    medians = []
    for _ in range(draws):
        pooled = [x for group in rng.choices(groups, k=len(groups)) for x in rng.choices(group, k=len(group))]
        medians.append(statistics.median(pooled))
    medians.sort()
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def centred(low: float, high: float) -> str:
    if 1.0 - CENTRE <= low and high <= 1.0 + CENTRE:
        return "yes"
    if high < 1.0 - CENTRE or low > 1.0 + CENTRE:
        return "no"
    return "cannot tell"


def pool(runs: list[dict]) -> list[dict]:
    rows = {}
    for run in runs:
        for name, result in run["scenarios"].items():
            for pairing, aa in result["aa"].items():
                rows.setdefault((name, pairing), []).append(aa)
    out = []
    for (name, pairing), readings in rows.items():
        groups = [list(aa["ratios"]) for aa in readings]
        low, high = interval(groups)
        out.append(
            {
                "scenario": name,
                "pairing": pairing,
                "runs": len(groups),
                "rounds": sum(len(g) for g in groups),
                "run_medians": [aa["median"] for aa in readings],
                "median": statistics.median([x for g in groups for x in g]),
                "interval": [low, high],
                "centred_within_1pct": centred(low, high),
            }
        )
    return out


def markdown(runs: list[dict], rows: list[dict]) -> str:
    cpu = runs[0]["cpu"]
    lines = [
        "# bench-check, pooled",
        "",
        f"{len(runs)} runs on {cpu.get('model')} ({'with' if cpu.get('bf16_units') else 'without'} bfloat16 units): "
        + ", ".join(run["folder"] for run in runs)
        + ".",
        "",
        "| scenario | pairing | runs' medians | rounds | pooled median | 95 % interval | centres within 1 % |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        medians = ", ".join(f"x{m:.3f}" for m in row["run_medians"])
        low, high = row["interval"]
        lines.append(
            f"| {row['scenario']} | {row['pairing']} | {medians} | {row['rounds']} | x{row['median']:.3f} | "
            f"{low:.3f}-{high:.3f} | {row['centred_within_1pct']} |"
        )
    lines += [
        "",
        "The interval is a two-level bootstrap (runs, then their rounds; seeded). 'cannot tell': the interval reaches "
        "past 1.00 +-1 % and into it, so more runs or a quieter machine are needed to say.",
        "",
    ]
    return "\n".join(lines)


def main(folders: list[Path], out: Path) -> int:
    runs = read_runs(folders)
    rows = pool(runs)
    out.mkdir(parents=True, exist_ok=True)
    report = {"runs": [run["folder"] for run in runs], "cpu": runs[0]["cpu"], "rows": rows}
    files.write_json(out / "pooled.json", report)
    text = markdown(runs, rows)
    files.write_text(out / "pooled.md", text)
    print(text)
    print(f"Written: {out}/pooled.json, {out}/pooled.md")
    return 0
