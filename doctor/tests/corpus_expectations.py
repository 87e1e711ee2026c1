"""What diagnose says about each corpus profile, recorded, and the check against that record.

tests/corpus_expectations.yaml holds, per corpus case (tests/user_pipelines.py; "case/stock" and
"case/bare" for the other two ways of capturing), the verdicts, the first recommendation's cause
and a band for its estimated gain, as observed over several profiles of that case. A change to
the analyser that changes what it concludes about the corpus shows up as a mismatch.

Recording (profiles every case ROUNDS times into ROOT, diagnoses them all and writes the file):

    python -m tests.corpus_expectations ROOT --rounds 3 [--out tests/corpus_expectations.yaml] [--pool]

`--cases KEY ...` records only those cases (new ones, or ones whose diagnosis a change meant to move) and
keeps every other record as it is.

The record names the machines it was made on (CPU, bfloat16 units, cores, TensorFlow). The two kinds of
machine this project runs on differ several-fold in how fast they run the corpus's models against its
pipelines, so a record made on one kind alone can fail on the other: `--pool` keeps what the file already
holds and widens it with this machine's observations (run it once on each kind). Cases whose verdict depends
on that speed ratio match their model to the machine instead (tests/user_pipelines.py, MATCHED).

Under load (how users profile on busy machines; the analysis must hold there too):

    python -m tests.corpus_expectations ROOT --rounds 5 --hog 2 [--pauses 200] --flips

`--hog N` keeps N busy-loop processes running while the rounds are profiled; `--pauses MS` stops the
profiling process now and then for up to MS ms (SIGSTOP, then SIGCONT: the process descheduled, as a
busy host or a throttled container does it); `--flips` prints, per case, how many profiles under ROOT
have another first cause than the planted one and how many disagree with the record, and writes nothing;
`--margins` prints, per case, how far its recorded first cause leads the next speed cause in the profiles
under ROOT (the least ratio of their scores): a planted cause should lead by 2x or more, or the record should
allow both.

`--fixes` prints, for the cases with a fixed pipeline, the first fix's estimated gain and the gain
per example measured on the fixed pipeline's profiles (the table in docs/figures.md). Profiles already under
ROOT/round_N/ are reused, so rounds made at different times (quiet, and
under another process's load) can be pooled. The gain band is the observed range of the share of
step time the first fix removes, widened by TOLERANCE points or the factor RATIO, whichever is
wider (profiles of the same script vary run to run; on a machine busy with other test suites the
no_prefetch case's share went from 19-25 % to 37 %), written as gains. It catches an estimate
gone wrong by more than that, not a small drift; verdicts and first causes are compared exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import yaml

from step_doctor.diagnose import xla
from step_doctor.diagnose.diagnosis import Run, RunDiagnosis
from step_doctor.diagnose.stages import under
from step_doctor.diagnose.verdict import HOST_BOUND, INPUT_BOUND, host_share, verdict

FILE = Path(__file__).with_name("corpus_expectations.yaml")
TOLERANCE = 10.0  # points of step time removed by the first fix ...
RATIO = 1.6  # ... or this factor on it, whichever is wider: a share of step time swings that much under load
NONE = None  # a "first" of None: no recommendation at all
MIN_GAIN = 1.05  # diagnose leaves out fixes estimated below this
SMALL_GAIN = 1.2  # a first fix below this, in a case recorded with several first causes, may be any of them
HOWS = {"numpy_function_map": ("stock", "bare")}  # cases also captured without step markers


def keys(cases) -> list[str]:
    """'case' for the step-marker capture, 'case/stock' and 'case/bare' for the others. The flips are not recorded:
    their verdict is what the model's speed against the pipeline's, measured where they run, implies (and so for the
    cases in xla_pipelines.NOT_RECORDED)."""
    from tests.user_pipelines import FLIPS
    from tests.xla_pipelines import NOT_RECORDED

    out = [case for case in cases if case not in FLIPS and case not in NOT_RECORDED]
    for case, hows in HOWS.items():
        out += [f"{case}/{how}" for how in hows]
    return out


def split(key: str) -> tuple[str, str]:
    case, _, how = key.partition("/")
    return case, how or "markers"


def load(path: Path = FILE) -> dict:
    return yaml.safe_load(path.read_text())["cases"]


def recorded_on(path: Path = FILE) -> list[dict]:
    """The machines whose profiles the record pools (machine() of each)."""
    return yaml.safe_load(path.read_text()).get("machines") or []


def machine() -> dict:
    """What a record depends on: the CPU (its speed against the models' sets the verdicts), whether it has bfloat16
    units, its cores, and TensorFlow's version."""
    import tensorflow as tf

    from step_doctor.machine import cpu_bf16, cpu_model

    return {
        "cpu": cpu_model(),
        "bf16_units": cpu_bf16(),
        "cores": os.cpu_count(),
        "tensorflow": tf.__version__,
    }


def _first(item: Run) -> tuple[str | None, float | None]:
    recs = item.recommendations
    return (recs[0].cause, recs[0].estimated_gain) if recs else (NONE, None)


TIE = 0.03  # two speed fixes whose estimated gains are this close (relative) rank by run-to-run noise


def first_or_tied(item: Run, causes: list) -> tuple[str | None, float | None]:
    """The first recommendation, or the one of `causes` whose estimated gain ties with it (within TIE: on a 2-core
    AMD EPYC without bf16 units many_files_sequential read heavy-map 1.21x, sequential-file-reads 1.20x) or that
    a first cache removes (caches_above)."""
    cause, gain = _first(item)
    if cause in causes or gain is None:
        return cause, gain
    first = item.recommendations[0]
    for rec in item.recommendations[1:]:
        if rec.cause in causes and rec.kind == "speed":
            if rec.estimated_gain >= gain * (1 - TIE) or caches_above(first, rec):
                return rec.cause, rec.estimated_gain
    return cause, gain


def caches_above(first, rec) -> bool:
    """`first` is a cache after a stage above `rec`'s: from the second epoch on it serves from memory what `rec`'s
    stage made, so it fixes `rec`'s cause too (many_files_sequential: a cache after the parse, its reads below it)."""
    if first.estimates:  # a fix of several: the cache must be what it gains by (not parallel calls)
        cache = first.estimates.get("cache", 0.0) >= first.estimated_gain * (1 - TIE)
    else:
        cache = first.cause == "decode-every-epoch"
    return cache and bool(first.stage and rec.stage) and under(rec.stage, first.stage)


NEAR_POINTS = 3.0  # an input share this close to the input-bound threshold reads either side of it by run-to-run noise
NEAR_SHARE = 0.1  # ... and so a CPU-only step's host share this close to HOST_BOUND


def verdicts_near(item: Run) -> set[str]:
    """The verdicts one diagnosis reads with its figures moved by run-to-run noise: its own, and the one across a
    threshold its figures are within NEAR_* of (the verdict's TIE). The CI machine read numpy_function_map_fixed
    host-bound, small-batch 1.93x (a host share of 0.51), where 16 profiles on a machine of the same kind read it
    input-bound or device-bound (one at an input share of 20.5 %)."""
    found = {item.verdict}
    if not isinstance(item, RunDiagnosis):
        return found
    profile = item.profile
    share = profile.input_bound_percent
    if share is None or not profile.step_time_ms or item.verdict == "unknown":
        return found
    under = {verdict(dataclasses.replace(profile, input_bound_percent=0.0))}  # the same step without its wait
    if item.device.cpu_only and abs(host_share(profile) - HOST_BOUND) <= NEAR_SHARE:
        under = {"host-bound", "device-bound"}
    if abs(share - INPUT_BOUND) <= NEAR_POINTS:
        return found | under | {"input-bound"}
    return found if share >= INPUT_BOUND else found | under


def mismatches(expected: dict, item: Run) -> list[str]:
    """What differs between one case's record and one diagnosis of it (empty: it agrees)."""
    found = []
    near = verdicts_near(item)
    if not near & set(expected["verdicts"]):
        found.append(f"verdict {item.verdict!r} (near it: {sorted(near)}), recorded {expected['verdicts']}")
    notes = item.notes if isinstance(item, RunDiagnosis) else ()
    if any(note.startswith("Unseen producers") for note in notes):
        return found  # TensorFlow 2.17 lost part of the trace: the diagnosis says so; ranks are not comparable
    if any(note.startswith(xla.UNRECORDED) for note in notes):
        return found  # TensorFlow 2.17's XLA on a CPU records nothing: no gain is estimated (diagnose/xla.py)
    allowed = _listed(expected["first"])
    cause, gain = first_or_tied(item, allowed)
    # Where the record saw several first causes (a pipeline with nothing planted), all of them small, which small
    # fix ranks first is noise: another cause is accepted as long as it is as small.
    small = len(allowed) > 1 and gain is not None and gain <= max(expected["gain"][1], SMALL_GAIN)
    if cause not in allowed and not small:
        found.append(f"first cause {cause!r}, recorded {allowed}")
    elif cause == expected["gain_of"] and gain is not None:
        low, high = expected["gain"]
        if not low <= gain <= high:
            found.append(f"estimated gain of {cause} {gain:.2f}x, recorded band {low:.2f}-{high:.2f}x")
    return found


def _gain(score: float) -> float:
    return 1 / (1 - min(max(score, 0.0), 95.0) / 100)


def summarize(observations: list[tuple[str, str | None, float | None]], planted: str | None) -> dict:
    """One case's record from its diagnoses: (verdict, first cause, its gain) per profile."""
    verdicts = sorted({v for v, _, _ in observations})
    firsts = [c for _, c, _ in observations]
    main = planted if planted is not None and planted in firsts else max(set(firsts), key=firsts.count)
    gains = [g for _, c, g in observations if c == main and g is not None]
    scores = [100 * (1 - 1 / g) for g in gains]
    removes = any(s > 0 for s in scores)  # a cause that changes what is learned removes no step time: gain 1.0
    low = round(_gain(min(min(scores) - TOLERANCE, min(scores) / RATIO)), 2) if removes else 1.0
    high = round(_gain(max(max(scores) + TOLERANCE, max(scores) * RATIO)), 2) if removes else 1.0
    if not planted and main is not NONE and low < MIN_GAIN:
        firsts.append(NONE)  # a fix this close to the 5 % cut-off may be left out, and nothing else found
    seen = sorted(set(firsts), key=lambda c: (c != main, str(c)))
    counts = {str(c): n for c in seen if (n := [f for _, f, _ in observations].count(c))}
    record = {
        "verdicts": verdicts,
        "first": main if planted else (seen if len(seen) > 1 else main),
        "gain_of": main,
        "gain": [low, high],
        "observed": {
            "profiles": len(observations),
            "first": counts,
            "gain": [min(gains), max(gains)] if gains else None,
        },
    }
    return record


def _listed(first) -> list:
    return first if isinstance(first, list) else [first]


def merge(old: dict, new: dict) -> dict:
    """One case's record that holds what both records saw: another machine's, or another time's, observations
    widen the verdicts, first causes and gain band; neither narrows them."""
    firsts = list(dict.fromkeys(_listed(old["first"]) + _listed(new["first"])))
    same = old["gain_of"] == new["gain_of"]
    band = [min(old["gain"][0], new["gain"][0]), max(old["gain"][1], new["gain"][1])] if same else new["gain"]
    seen_old, seen_new = old["observed"], new["observed"]
    counts = dict(seen_old["first"])
    for cause, count in seen_new["first"].items():
        counts[cause] = counts.get(cause, 0) + count
    gains = [g for g in (seen_old["gain"] if same else None, seen_new["gain"]) if g]
    return {
        "verdicts": sorted(set(old["verdicts"]) | set(new["verdicts"])),
        "first": firsts if len(firsts) > 1 else firsts[0],
        "gain_of": new["gain_of"],
        "gain": band,
        "observed": {
            "profiles": seen_old["profiles"] + seen_new["profiles"],
            "first": counts,
            "gain": [min(g[0] for g in gains), max(g[1] for g in gains)] if gains else None,
        },
    }


def _profile_rounds(root: Path, rounds: int, only: set | None = None) -> None:
    from tests import user_pipelines

    files = user_pipelines.make_files(root / "files")
    for number in range(1, rounds + 1):
        for key in keys(user_pipelines.ALL):
            if only and key not in only:
                continue
            case, how = split(key)
            logdir = root / f"round_{number}" / key.replace("/", "__")
            if not logdir.exists():
                user_pipelines.profile(case, files, logdir, how=how)
                print(f"profiled {key} (round {number})", file=sys.stderr, flush=True)


@contextlib.contextmanager
def busy_machine(hogs: int = 0, pauses_ms: float = 0.0):
    """Other load on the machine while the block runs: `hogs` busy-loop processes; and, with `pauses_ms`, a
    process that stops this one for up to that long every 0.2-1 s. Only the processes started here are ended."""
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    if pauses_ms:
        started.append(subprocess.Popen([sys.executable, "-c", _PAUSER, str(os.getpid()), str(pauses_ms)]))
    try:
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()
        os.kill(os.getpid(), signal.SIGCONT)  # in case the pauser was ended between its stop and its continue


_PAUSER = """
import os, random, signal, sys, time
pid, longest = int(sys.argv[1]), float(sys.argv[2]) / 1e3
while True:
    time.sleep(random.uniform(0.2, 1.0))
    os.kill(pid, signal.SIGSTOP)
    time.sleep(random.uniform(0.25, 1.0) * longest)
    os.kill(pid, signal.SIGCONT)
"""


def _diagnosed(root: Path, keep) -> Iterator[tuple[str, Run]]:
    """(key, its diagnosis) for each profile under ROOT/round_N/ whose key `keep` accepts, in order."""
    from step_doctor.diagnose.report import diagnose

    for logdir in sorted(root.glob("round_*/*")):
        key = logdir.name.replace("__", "/")
        if keep(key):
            (item,) = diagnose(logdir).runs.values()
            yield key, item


def flips(root: Path) -> dict:
    """Per case: (profiles, first cause not the planted one (first_or_tied), disagreeing with the record) over the
    profiles under ROOT, as diagnose sees them now."""
    from tests.test_diagnose_corpus import PLANTED

    expected, found = load(), defaultdict(lambda: [0, 0, 0])
    for key, item in _diagnosed(root, expected.__contains__):
        planted = PLANTED.get(split(key)[0])
        counts = found[key]
        counts[0] += 1
        counts[1] += bool(planted and first_or_tied(item, [planted])[0] != planted)
        counts[2] += bool(mismatches(expected[key], item))
    return dict(found)


def margins(root: Path) -> dict:
    """Per case: over the profiles under ROOT, how far the recorded first cause leads the next speed cause (the
    ratio of their scores; None where nothing else is ranked or the first is not ranked by a score). A planted
    cause that leads by little flips with a run's noise: the text pipelines once led by 1.5x here, and a CI run
    read them the other way round."""
    expected, found = load(), defaultdict(list)
    for key, item in _diagnosed(root, expected.__contains__):
        first = set(_listed(expected[key]["first"]))
        speed = [r for r in item.recommendations if r.kind == "speed"]
        if speed and any(r.cause in first and caches_above(speed[0], r) for r in speed[1:]):
            first.add(speed[0].cause)  # the cache that fixes the recorded first cause leads for it
        lead = max((r.score for r in speed if r.cause in first), default=0.0)
        other = max((r.score for r in speed if r.cause not in first), default=0.0)
        # None: nothing else ranked, or the recorded first is not ranked by its score (a structural fix, or none)
        found[key].append(round(lead / other, 2) if other and lead else None)
    return dict(found)


def record(root: Path, rounds: int, out: Path, pool: bool = False, only: set | None = None) -> dict:
    """Profile and diagnose the cases (`only`: these keys, the others' records kept) and write the record."""
    from tests.test_diagnose_corpus import PLANTED
    from tests.user_pipelines import ALL

    _profile_rounds(root, rounds, only)
    seen = defaultdict(list)
    for key, item in _diagnosed(root, lambda key: split(key)[0] in ALL and (not only or key in only)):
        planted = PLANTED.get(split(key)[0])
        seen[key].append((item.verdict, *(first_or_tied(item, [planted]) if planted else _first(item))))
    cases = {key: summarize(obs, PLANTED.get(split(key)[0])) for key, obs in sorted(seen.items())}
    machines = [machine()]
    if pool and out.exists():  # what the record already holds, from other machines or other rounds, stays in it
        before = load(out)
        cases = {key: merge(before[key], case) if key in before else case for key, case in cases.items()}
        machines = [m for m in recorded_on(out) if m != machines[0]] + machines
    if only and out.exists():
        cases = dict(sorted({**load(out), **cases}.items()))
        machines = [m for m in recorded_on(out) if m != machines[-1]] + machines[-1:]
    header = (
        "# What diagnose concludes about each corpus case (tests/corpus_expectations.py says how it was\n"
        "# recorded and how it is compared). Written by `python -m tests.corpus_expectations`.\n"
    )
    out.write_text(
        header
        + yaml.safe_dump(
            {"machines": machines, "tolerance_points": TOLERANCE, "tolerance_ratio": RATIO, "cases": cases},
            sort_keys=False,
            default_flow_style=None,
            width=120,
        )
    )
    return cases


def fixes(root: Path) -> dict:
    """Per case with a fixed pipeline: the first fix's estimated gain and the gain per example measured by
    profiling the fixed pipeline, each as (median, [per round]) over the rounds under ROOT."""
    from statistics import median

    from step_doctor.diagnose.report import diagnose
    from tests.user_pipelines import FIXED

    def per_example(item: RunDiagnosis) -> float:
        wait = item.profile.wait
        return wait.step_ms / wait.batch_size

    found = {}
    for case in sorted(FIXED):
        estimated, measured = [], []
        for round_dir in sorted(root.glob("round_*")):
            before, after = round_dir / case, round_dir / f"{case}_fixed"
            if before.is_dir() and after.is_dir():
                (b,) = diagnose(before).runs.values()
                (a,) = diagnose(after).runs.values()
                estimated.append(b.recommendations[0].estimated_gain)
                measured.append(round(per_example(b) / per_example(a), 2))
        if estimated:
            found[case] = {"estimated": (median(estimated), estimated), "measured": (median(measured), measured)}
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a folder for the profiles (kept, reused by later calls)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=FILE)
    parser.add_argument("--fixes", action="store_true", help="print estimated and measured gains of the first fixes")
    parser.add_argument("--hog", type=int, default=0, help="busy-loop processes to run while profiling")
    parser.add_argument(
        "--pauses", type=float, default=0.0, help="stop the profiling process for up to MS ms now and then"
    )
    parser.add_argument("--flips", action="store_true", help="count first causes that are not the planted one")
    parser.add_argument(
        "--margins", action="store_true", help="print how far each case's recorded first cause leads the next"
    )
    parser.add_argument(
        "--pool",
        action="store_true",
        help="keep what the record already holds (another machine's observations) and widen it with these",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        metavar="KEY",
        help="profile and record only these cases (keys as in the file), keep the others",
    )
    args = parser.parse_args()
    only = set(args.cases) if args.cases else None
    if args.hog or args.pauses:
        with busy_machine(args.hog, args.pauses):
            _profile_rounds(args.root, args.rounds, only)
    if args.flips or args.margins:
        if not (args.hog or args.pauses):
            _profile_rounds(args.root, args.rounds, only)
        if args.flips:
            for key, (profiles, planted, disagree) in sorted(flips(args.root).items()):
                print(
                    f"{key:40s} profiles {profiles}  first not planted {planted}  disagrees with the record {disagree}"
                )
        if args.margins:
            for key, ratios in sorted(margins(args.root).items()):
                led = sorted(r for r in ratios if r is not None)
                least = f"led by {led[0]}x at least" if led else "never ranked against another"
                print(f"{key:40s} profiles {len(ratios)}  {least}  ({len(ratios) - len(led)} not ranked against one)")
        sys.exit(0)
    if args.fixes:
        for case, figures in fixes(args.root).items():
            print(f"{case:28s} estimated {figures['estimated']}  measured {figures['measured']}")
        sys.exit(0)
    for key, case in record(args.root, args.rounds, args.out, pool=args.pool, only=only).items():
        print(f"{key:40s} {case['verdicts']} {case['first']} {case['gain']} observed {case['observed']}")
