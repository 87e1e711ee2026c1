"""`python -m step_doctor_dev.bench_held_out`: the doctor's first fix on held-out scripts, against the same fix made by
hand.

Issue 38's rules, on pipelines written after the estimates were and never tuned on (held_out/<case>/train.py): the
first fix's estimate within 25 % of the gain the same fix gives by hand, `profile --prove`'s measurement within
15 % of it, and its patch applied to a copy of the script: whether it exits as the script does, and whether it is the
hand-made fix. Each case runs unmodified under `step-doctor profile --prove --json` in a folder of its own; then the
script and its hand-fixed copy (FIXES: the lines a user would change for the doctor's first fix) are timed in
alternating pairs of processes. A process's step time is taken from two runs of different lengths (the difference
leaves out start-up, tracing and the first pass that fills a cache; the longer lasts 5 s more for the fixed script, so
the start-up's variation stays small against it), and the pair's gain is the ratio of the two;
the median and range of the pairs are reported. Written to <out>/held_out.{json,md}, with the CPU and the load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from step_doctor import files
from step_doctor.errors import UserError
from step_doctor_dev.prove_corpus import ENV, cpu_line, proved

HERE = Path(__file__).resolve().parent / "held_out"
# case -> (the cause the first fix answers, the lines changed by hand for it: old -> new)
FIXES = {
    "lookup_in_map": (
        "python-in-map",
        {
            "ds = ds.map(lambda x, y: (tf.numpy_function(fetch, [x], tf.float32), y))": (
                "ds = ds.map(lambda x, y: (tf.numpy_function(fetch, [x], tf.float32), y), "
                "num_parallel_calls=tf.data.AUTOTUNE)"
            ),
        },
    ),
    "png_no_prefetch": (
        "decode-every-epoch",
        {
            "ds = tf.data.Dataset.from_tensor_slices(files).shuffle(96).repeat()": (
                "ds = tf.data.Dataset.from_tensor_slices(files)"
            ),
            "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(24)": (
                "ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache().shuffle(96).repeat().batch(24)"
            ),
        },
    ),
    "small_record_files": (
        "decode-every-epoch",
        {
            'ds = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob("records/*.tfrecord"))).repeat()': (
                'ds = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob("records/*.tfrecord")))'
            ),
            "ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(32).prefetch(1)": (
                "ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).cache().repeat().batch(32).prefetch(1)"
            ),
        },
    ),
}
SHORT = 60  # steps of the short run of a timed pair; the long one is longer by steps the fixed script runs in SIGNAL_S
SIGNAL_S = 5.0  # the steps the pair times, at least: a process's start-up varies by a tenth of a second or two
FEWEST, MOST = 400, 8000


def prepare(case: str, out: Path) -> Path:
    """The case's folder under out: its script, the hand-fixed copy, and its data (made by a first short run)."""
    where = out / case
    where.mkdir(parents=True, exist_ok=True)
    source = (HERE / case / "train.py").read_text()
    fixed = source
    for old, new in FIXES[case][1].items():
        if fixed.count(old) != 1:
            raise UserError(f"{HERE / case / 'train.py'}: the line to fix by hand is not there once: {old}")
        fixed = fixed.replace(old, new)
    (where / "train.py").write_text(source)
    (where / "fixed.py").write_text(fixed)
    subprocess.run([sys.executable, "train.py", "3"], cwd=where, check=True, capture_output=True, env=ENV)
    return where


def prove(where: Path, rounds: int) -> dict:
    started = time.time()
    document, run = proved(where, [sys.executable, "train.py"], rounds, allow=[])
    ranked = run.get("recommendations") or []
    return {
        "first": ranked[0]["cause"] if ranked else None,
        "estimates": {r["cause"]: r.get("estimated_gain") for r in ranked},
        "proofs": document.get("prove", {}).get("each", []),
        "patch": patched(where, document.get("prove", {})),
        "seconds": round(time.time() - started, 1),
    }


def patched(where: Path, prove_document: dict) -> str:
    """What prove's patch does: applied (git apply) to a copy of the script, whether the copy exits as the script does
    and whether it is the hand-made fix, line for line."""
    if not prove_document.get("patch"):
        return "none" + (f" ({'; '.join(prove_document['patch_notes'])})" if prove_document.get("patch_notes") else "")
    copy = where / "patched"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    shutil.copy(where / "train.py", copy / "train.py")
    applied = subprocess.run(["git", "apply", prove_document["patch"]], cwd=copy, capture_output=True, text=True)
    if applied.returncode:
        return f"does not apply: {applied.stderr.strip()}"
    for data in where.iterdir():  # the data the first run made, beside the script
        if data.is_dir() and data.name not in ("logs", "patched"):
            (copy / data.name).symlink_to(data)
    ran = subprocess.run([sys.executable, "train.py", "20"], cwd=copy, capture_output=True, env=ENV)
    same = (copy / "train.py").read_text() == (where / "fixed.py").read_text()
    return f"applies, exits {ran.returncode}" + (", the fix by hand" if same else ", not the fix by hand")


def _seconds(where: Path, script: str, steps: int) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, script, str(steps)], cwd=where, check=True, capture_output=True, env=ENV)
    return time.perf_counter() - started


def by_hand(where: Path, pairs: int) -> dict:
    """The script against its hand-fixed copy, alternating which runs first: per pair, the ratio of step times. The
    long run is as long as makes the fixed script's timed steps last SIGNAL_S (a probe of it says how long that is), so
    that the start-up's variation stays a few per cent of what is timed."""
    probe = (_seconds(where, "fixed.py", SHORT + FEWEST) - _seconds(where, "fixed.py", SHORT)) / FEWEST
    short, long = SHORT, SHORT + int(min(max(SIGNAL_S / max(probe, 1e-4), FEWEST), MOST))
    ratios, step_ms = [], {"train.py": [], "fixed.py": []}
    for pair in range(pairs):
        order = ("train.py", "fixed.py") if pair % 2 == 0 else ("fixed.py", "train.py")
        for script in order:
            step = (_seconds(where, script, long) - _seconds(where, script, short)) / (long - short)
            step_ms[script].append(round(1000 * step, 3))
        ratios.append(step_ms["train.py"][-1] / step_ms["fixed.py"][-1])
    found = {"gain": statistics.median(ratios), "low": min(ratios), "high": max(ratios), "ratios": ratios}
    return {**found, "lengths": [short, long], **step_ms}


def table(rows: list[dict]) -> str:
    lines = [
        "| case | first cause (estimate) | by hand: gain (pairs' range) | estimate / by hand | prove "
        "| prove / by hand | prove's patch |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for row in rows:
        cause, hand = row["fixed_cause"], row["by_hand"]
        estimate = row["estimates"].get(cause)
        first = f"{row['first']} (x{row['estimates'][row['first']]:.2f})" if row["first"] else "none"
        if row["first"] != cause:
            first += f"; {cause} x{estimate:.2f}" if estimate else f"; {cause} not named"
        proof = next((p for p in row["proofs"] if cause in p.get("causes", ())), None)
        if proof and proof.get("gain"):
            proved = f"{proof['verdict']} x{proof['gain']:.2f} (x{proof['low']:.2f}-x{proof['high']:.2f})"
            ratio = f"{proof['gain'] / hand['gain']:.2f}"
        else:
            proved, ratio = f"not proved: {proof['why']}" if proof else "not tried", "-"
        cells = [
            row["case"],
            first,
            f"x{hand['gain']:.2f} (x{hand['low']:.2f}-x{hand['high']:.2f})",
            f"{estimate / hand['gain']:.2f}" if estimate else "-",
            proved,
            ratio,
            row.get("patch", "-"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/held-out"))
    parser.add_argument("--cases", nargs="*", default=list(FIXES), choices=list(FIXES))
    parser.add_argument("--rounds", type=int, default=3, help="prove's rounds")
    parser.add_argument("--pairs", type=int, default=5, help="timed pairs of the script and its hand-fixed copy")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    before = os.getloadavg()
    rows = []
    for case in args.cases:
        where = prepare(case, out)
        shutil.rmtree(where / "logs", ignore_errors=True)
        row = {"case": case, "fixed_cause": FIXES[case][0], **prove(where, args.rounds)}
        row["by_hand"] = by_hand(where, args.pairs)
        rows.append(row)
        done = f"{case}: {row['seconds']:.0f} s prove, by hand x{row['by_hand']['gain']:.2f}"
        print(done, file=sys.stderr, flush=True)
    cpu = cpu_line()
    result = {"cpu": cpu, "load_average": {"before": before, "after": os.getloadavg()}, "rows": rows}
    files.write_json(out / "held_out.json", result)
    text = f"On {cpu}; load average {before[0]:.2f} before, {os.getloadavg()[0]:.2f} after.\n\n" + table(rows)
    (out / "held_out.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
