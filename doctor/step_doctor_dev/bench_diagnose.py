"""`make bench-diagnose`: wall time and peak memory of `diagnose` against the size of the profile.

Profiles (made here by scale/diagnose_scale.py, kept under OUT/profiles/ for the
next run): real captures of 12, 120 and 600 steps of a serial JPEG-decoding pipeline, and
GPU-shaped profiles of 1, 10, 100 and 1,000 MB built from them. Each measurement runs
`step-doctor diagnose LOGDIR --json` in a fresh process, so its peak RSS is its own
(read from wait4's rusage); rounds are interleaved (every profile once per round), and each
measurement records the machine's load average, since other work on the same cores slows
it. `--code DIR` measures another checkout instead (the reader before issue 24: a worktree
of main at c765101). Results: OUT/bench.json, OUT/bench.png (log-log, with the line that
linear growth would follow) and a table on stdout.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from step_doctor import files, machine
from step_doctor.errors import Stopped, UserError
from step_doctor_dev import diagnose_scale

SESSION = "2026_01_01_00_00_00"  # one fixed session folder per generated profile
# The child records its own peak: wait4's ru_maxrss would include the memory of this process (it counts
# the image the child was forked from), and this one holds TensorFlow. VmHWM is the peak after exec. To it
# the peak of xprof's converter, which runs in a child of its own (xprof_converter.py) beside the diagnosis,
# is added: the two at once at worst. (Checkouts from before that child have no child_peak_kb.)
_CHILD = """
import atexit, runpy, sys
path, module = sys.argv.pop(1), sys.argv.pop(1)
def peak():
    with open('/proc/self/status') as status:
        own = int(next((line.split()[1] for line in status if line.startswith('VmHWM:')), 0))
    converter = sys.modules.get(module + '.diagnose.xprof_converter')
    with open(path, 'w') as out:
        out.write(f"{own} {converter.child_peak_kb() if converter else 0}")
atexit.register(peak)
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""
HERE = Path(__file__).resolve().parents[2]  # the folder that holds step_doctor/


def _code(folder: Path | None) -> tuple[Path, str]:
    """Where a diagnose to measure lives and how it runs: this doctor, another checkout's doctor, or a checkout
    from before the doctor was a package of its own (its diagnose was `python -m train diagnose`)."""
    if folder is None:
        return HERE, "step_doctor"
    for where, module in ((folder, "step_doctor"), (folder / "doctor", "step_doctor"), (folder, "train")):
        if (where / module / "diagnose").is_dir():
            return where, module
    raise UserError(f"--code {folder}: not a checkout of this project (no step_doctor/diagnose/ or train/diagnose/).")


def base_steps(size_mb: float) -> int:
    """The capture a GPU-shaped profile of this size is built from (its host side stays below the size)."""
    return 12 if size_mb < 5 else 120 if size_mb < 50 else 600


def _captures(out: Path, steps: list[int]) -> dict[int, Path]:
    made = {}
    for n in steps:
        folder = out / "profiles" / f"capture-{n}-steps"
        found = sorted((folder / "profile").rglob("*.xplane.pb"))
        if not found:
            print(f"capturing {n} steps of the serial JPEG pipeline into {folder}", flush=True)
            found = [diagnose_scale.capture(n, folder)]
        made[n] = found[0]
    return made


def _gpu_profile(out: Path, size_mb: float, base: Path) -> Path:
    logdir = out / "profiles" / f"gpu-{size_mb:g}MB"
    path = logdir / "plugins" / "profile" / SESSION / "host.xplane.pb"
    if not path.is_file() or abs(path.stat().st_size / 1e6 - size_mb) > 0.1 * size_mb:
        print(f"writing a GPU-shaped profile of {size_mb:g} MB from {base.name}", flush=True)
        made = diagnose_scale.gpu_shaped(base, path, size_mb)
        print(
            f"  {made['bytes'] / 1e6:,.1f} MB: {made['steps']} steps, {made['devices']} GPU(s), "
            f"{made['kernels_per_step_per_device']:,} kernels per step per GPU",
            flush=True,
        )
    return logdir


def _measure(logdir: Path, code: Path | None, timeout: float) -> dict:
    """One `diagnose` of logdir in a fresh process: wall seconds, peak RSS, exit status, load average."""
    cwd, module = _code(code)
    env = {**os.environ, "PYTHONPATH": str(cwd), "TF_CPP_MIN_LOG_LEVEL": "2"}
    load = os.getloadavg()[0]
    peak_file = Path(tempfile.mkstemp(prefix="peak-rss-")[1])
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(peak_file), module, "diagnose", str(Path(logdir).resolve()), "--json"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.02)
    except BaseException:
        child.kill()
        child.wait()
        raise
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # already reaped: keep Popen from waiting again
    own_kb, converter_kb = (int(kb) for kb in (peak_file.read_text().split() or ["0", "0"]))
    peak_file.unlink()
    return {
        "seconds": round(seconds, 3),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss_mb": round((own_kb + converter_kb) / 1024, 1),
        "converter_rss_mb": round(converter_kb / 1024, 1),  # of that, xprof's converter's child (up to 8 MB)
        "status": child.returncode,
        "load": round(load, 2),
    }


def _summary(samples: list[dict]) -> dict:
    ok = [s for s in samples if s["status"] == 0] or samples

    def spread(key):
        values = [s[key] for s in ok]
        return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}

    return {
        "seconds": spread("seconds"),
        "cpu_seconds": spread("cpu_seconds"),
        "peak_rss_mb": spread("peak_rss_mb"),
        "failed": sum(s["status"] != 0 for s in samples),
    }


def table(result: dict) -> str:
    lines = [
        f"diagnose on {result['cpu']} ({os.cpu_count()} cores), {result['rounds']} interleaved rounds, "
        f"load average {result['load']['min']:.1f}-{result['load']['max']:.1f} during the measurements; code: "
        f"{result['code']}",
        f"{'profile':<24}{'MB':>9}{'wall s (median, min-max)':>28}{'CPU s':>8}{'peak RSS MB (min-max)':>26}",
    ]
    for row in result["profiles"]:
        wall, rss = row["seconds"], row["peak_rss_mb"]
        lines.append(
            f"{row['name']:<24}{row['mb']:>9,.1f}{wall['median']:>12.2f} ({wall['min']:.2f}-{wall['max']:.2f})"
            f"{row['cpu_seconds']['median']:>14.2f}{rss['median']:>12,.0f} ({rss['min']:,.0f}-{rss['max']:,.0f})"
            + (f"  {row['failed']} failed" if row["failed"] else "")
        )
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    """Wall time and peak RSS against profile size, log-log, with the line linear growth would follow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "seconds", "wall time (s)"), (axes[1], "peak_rss_mb", "peak RSS (MB)")):
        for kind, marker, colour in (("capture", "o", "#1f77b4"), ("gpu", "s", "#d62728")):
            rows = sorted((r for r in result["profiles"] if r["kind"] == kind), key=lambda r: r["mb"])
            if not rows:
                continue
            x = [r["mb"] for r in rows]
            y = [r[key]["median"] for r in rows]
            err = [[r[key]["median"] - r[key]["min"] for r in rows], [r[key]["max"] - r[key]["median"] for r in rows]]
            name = "real captures (12/120/600 steps)" if kind == "capture" else "GPU-shaped (device planes added)"
            ax.errorbar(x, y, yerr=err, fmt=marker + "-", color=colour, capsize=3, label=name)
            linear = "growth linear in size, from the smallest" if kind == "gpu" else None
            ax.plot(x, [y[0] * v / x[0] for v in x], ":", color=colour, linewidth=1, label=linear)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("profile size (MB)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"diagnose: median of {result['rounds']} runs, each in a fresh process ({result['cpu']})", fontsize=10)
    fig.tight_layout()
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)


def main(args) -> int:
    out = Path(args.out)
    code = Path(args.code).resolve() if args.code else None
    _code(code)  # a folder that holds no diagnose is refused before anything is measured

    def stop(signum, _frame):
        raise Stopped(f"bench-diagnose stopped by signal {signum}; nothing written", 128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        result = _run(args, out, code)
    finally:
        signal.signal(signal.SIGTERM, previous)
    name = args.name or ("bench" if code is None else "bench-" + code.name)
    files.write_json(out / f"{name}.json", result)
    chart(result, out / f"{name}.png")
    print(table(result))
    print(f"-> {out / (name + '.json')}, {out / (name + '.png')}")
    return 0


def _run(args, out: Path, code: Path | None) -> dict:
    sizes = [s for s in args.sizes if s <= args.max_mb]
    captures = _captures(out, sorted(set(args.captures) | {base_steps(s) for s in sizes}))
    profiles = [
        {"name": f"capture {n} steps", "kind": "capture", "logdir": path.parents[3]}
        for n, path in captures.items()
        if n in args.captures
    ]
    profiles += [
        {"name": f"GPU-shaped {s:g} MB", "kind": "gpu", "logdir": _gpu_profile(out, s, captures[base_steps(s)])}
        for s in sizes
    ]
    for row in profiles:
        row["mb"] = round(sum(p.stat().st_size for p in Path(row["logdir"]).rglob("*.xplane.pb")) / 1e6, 2)
        row["samples"] = []
    for index in range(args.rounds):
        for row in profiles:
            sample = _measure(row["logdir"], code, args.timeout)
            row["samples"].append(sample)
            print(
                f"round {index + 1}/{args.rounds} {row['name']:<22} {sample['seconds']:8.2f} s "
                f"{sample['peak_rss_mb']:8,.0f} MB  status {sample['status']}  load {sample['load']}",
                flush=True,
            )
    for row in profiles:
        row.update(_summary(row["samples"]))
        row["logdir"] = str(row["logdir"])
    loads = [s["load"] for row in profiles for s in row["samples"]]
    return {
        "cpu": machine.cpu_model(),
        "code": str(_code(code)[0]),
        "rounds": args.rounds,
        "load": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "profiles": profiles,
    }


def parser() -> argparse.ArgumentParser:
    bench_diagnose = argparse.ArgumentParser(
        prog="python -m step_doctor_dev.bench_diagnose",
        description="Wall time and peak memory of `step-doctor diagnose` against profile size (captures up to 1 GB).",
    )
    bench_diagnose.add_argument("--out", default="runs/bench-diagnose", help="output folder (default: %(default)s)")
    bench_diagnose.add_argument(
        "--sizes",
        type=float,
        nargs="*",
        default=[1, 10, 100, 1000],
        metavar="MB",
        help="sizes of the GPU-shaped profiles (default: %(default)s)",
    )
    bench_diagnose.add_argument(
        "--captures",
        type=int,
        nargs="*",
        default=[12, 120, 600],
        metavar="STEPS",
        help="real captures measured too, in steps (default: %(default)s)",
    )
    bench_diagnose.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    bench_diagnose.add_argument(
        "--max-mb", type=float, default=float("inf"), help="leave out profiles larger than this (default: none)"
    )
    bench_diagnose.add_argument(
        "--code", help="measure the diagnose of this checkout instead (e.g. a worktree of main at an older commit)"
    )
    bench_diagnose.add_argument("--name", help="file name of the results (default: bench, or bench-<code folder>)")
    bench_diagnose.add_argument(
        "--timeout", type=float, default=900.0, help="seconds one diagnose may take (default: %(default)s)"
    )
    bench_diagnose.set_defaults(func=main)
    return bench_diagnose


if __name__ == "__main__":
    from step_doctor.cli import run

    sys.exit(run(parser().parse_args()))
