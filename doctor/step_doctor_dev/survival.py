"""`python -m step_doctor_dev.bench_profile --multi-worker N`: does `profile` ever kill a multi-worker run?

The diagnose corpus's two-worker script (tests/user_pipelines.py multi_worker_generator: two local
MultiWorkerMirroredStrategy workers started by the script, a custom loop) runs N times under
`step-doctor profile` and N times alone, interleaved (with, without, without, with, ...), each a fresh set
of processes. A run counts as a death when a worker was killed by a signal (the script prints each worker's
exit code; TensorFlow's profiler crash in stop() is a SIGSEGV or SIGABRT). Profiled runs also count the
workers that were captured, got a verdict, and had the fix for that crash loaded (site/consume_fix.py).
Writes OUT/multi-worker.json with every run and the counts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from step_doctor import files
from step_doctor.errors import UserError
from step_doctor_dev.bench_profile import SCRIPT

CASE = "multi_worker_generator"


def _run(profiled: bool, data: Path, work: Path, index: int, timeout: float) -> dict:
    script = [sys.executable, str(SCRIPT), CASE, str(data)]
    logdir = work / f"profile-{index}"
    command = [sys.executable, "-m", "step_doctor", "profile", "--json", "--logdir", str(logdir), "--", *script]
    started = time.time()
    try:
        done = subprocess.run(command if profiled else script, capture_output=True, text=True, timeout=timeout)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as error:
        returncode, stdout, stderr = None, "", str(error.stderr or "")
    ended = re.findall(r"^workers ended: (.*)$", stderr, re.M)
    codes = [int(code) for code in ended[-1].split()] if ended else []
    row = {
        "profiled": profiled,
        "returncode": returncode,
        "seconds": round(time.time() - started, 1),
        "worker_codes": codes,
        "died": any(code < 0 for code in codes) or returncode is None,
    }
    if profiled and stdout.strip().startswith("{"):
        document = json.loads(stdout)
        workers = [p for p in document["capture"]["processes"] if (p.get("run") or "").startswith("worker-")]
        row["captured"] = sum((p.get("capture") or {}).get("state") == "done" for p in workers)
        row["fix_loaded"] = sum(bool((p.get("consume_fix") or {}).get("loaded")) for p in workers)
        row["verdicts"] = sorted(item["verdict"] for item in document["runs"].values())
    if row["died"]:
        row["stderr_tail"] = stderr[-1500:]
    return row


def measure(runs: int, timeout: float, out: Path) -> dict:
    if not SCRIPT.is_file():
        raise UserError(f"bench-profile --multi-worker runs {SCRIPT}, which comes with a checkout of the repository.")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-profile-mw-") as folder:
        work = Path(folder)
        data = work / "files"
        subprocess.run([sys.executable, str(SCRIPT), "--make-files", str(data)], check=True, timeout=300)
        for index in range(runs):
            for profiled in (True, False) if index % 2 == 0 else (False, True):
                row = _run(profiled, data, work, index, timeout)
                rows.append(row)
                kind = "profiled" if profiled else "alone"
                print(
                    f"run {index + 1}/{runs} {kind:8s}: {'DIED' if row['died'] else 'ok'} in {row['seconds']:.0f} s, "
                    f"workers {row['worker_codes']}"
                    + (f", captured {row.get('captured')}, fix loaded {row.get('fix_loaded')}" if profiled else ""),
                    flush=True,
                )
            # Written after every pair, so a run cut short (Ctrl-C, a lost machine) keeps what it counted.
            files.write_json(out / "multi-worker.json", {**_counts(rows), "planned": runs, "complete": False})
    return {**_counts(rows), "planned": runs, "complete": True}


def _counts(rows: list[dict]) -> dict:
    def count(profiled: bool) -> dict:
        mine = [r for r in rows if r["profiled"] == profiled]
        found = {"runs": len(mine), "deaths": sum(r["died"] for r in mine)}
        if profiled:
            found["workers_captured"] = sum(r.get("captured", 0) for r in mine)
            found["workers_with_the_fix"] = sum(r.get("fix_loaded", 0) for r in mine)
            found["runs_with_two_verdicts"] = sum(len(r.get("verdicts", [])) == 2 for r in mine)
        return found

    from step_doctor import machine

    return {
        "case": CASE,
        "cpu": machine.cpu_model(),
        "load_average": os.getloadavg(),
        "profiled": count(True),
        "alone": count(False),
        "runs": rows,
    }


def main(args) -> int:
    if args.multi_worker < 1:
        raise UserError("--multi-worker N needs N >= 1 (profiled runs; as many run alone).")
    out = Path(args.out)
    load_before = os.getloadavg()
    result = measure(args.multi_worker, timeout=600, out=out)
    result["load_average_before"] = load_before
    profiled, alone = result["profiled"], result["alone"]
    print(
        f"{CASE} on {result['cpu']}: profiled {profiled['deaths']} deaths in {profiled['runs']} runs "
        f"({profiled['workers_captured']} of {2 * profiled['runs']} workers captured, the fix loaded in "
        f"{profiled['workers_with_the_fix']}, two verdicts in {profiled['runs_with_two_verdicts']} runs); alone "
        f"{alone['deaths']} deaths in {alone['runs']} runs"
    )
    files.write_json(out / "multi-worker.json", result)
    print(f"wrote {out / 'multi-worker.json'}")
    return 1 if profiled["deaths"] else 0
