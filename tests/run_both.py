"""Both products' tests: the template's (tests/) and the doctor's (doctor/tests/, run from doctor/).

    python tests/run_both.py [--in-turn] MARKERS [PYTEST_ARGS ...]

Side by side by default (`make test-fast`): each pytest keeps about one core busy (its wall time and
CPU time agree within a few per cent), so on 2 cores the pair takes little more than the longer of
the two; the template's output streams as it runs, the doctor's follows when both have ended.
`--in-turn` (`make test`, `make test-long`) runs the template's, then the doctor's, because the
doctor's slow tests profile models whose verdicts need the machine to themselves. Both always run;
the exit status is the first failure's, where a run that selected no test (pytest's 5, e.g. a `-k`
that names tests of one product only) fails only if the other selected none either. Ctrl-C or
SIGTERM stops both and exits 130 or 143.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NONE_SELECTED = 5  # pytest's exit status when no test was collected


def commands(markers: str, rest: list[str]) -> list[tuple[list[str], Path]]:
    pytest = [sys.executable, "-m", "pytest"]
    return [
        ([*pytest, "-m", markers, *rest], ROOT),
        ([*pytest, "-m", f"{markers} and not install", *rest], ROOT / "doctor"),
    ]


def status(codes: list[int]) -> int:
    ran = [code for code in codes if code != NONE_SELECTED]
    if not ran:
        return NONE_SELECTED
    return next((code for code in ran if code), 0)


def main(argv: list[str]) -> int:
    in_turn = argv[:1] == ["--in-turn"]
    argv = argv[1:] if in_turn else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    (template, template_dir), (doctor, doctor_dir) = commands(argv[0], argv[1:])
    running: list[subprocess.Popen] = []
    stopped: list[int] = []

    def stop(signum, _frame):
        stopped.append(signum)
        for child in running:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with tempfile.TemporaryFile("w+") as doctor_log:
        if in_turn:
            running.append(subprocess.Popen(template, cwd=template_dir))
            codes = [running[0].wait()]
            if not stopped:
                running.append(subprocess.Popen(doctor, cwd=doctor_dir))
                codes.append(running[1].wait())
        else:
            running.append(subprocess.Popen(doctor, cwd=doctor_dir, stdout=doctor_log, stderr=subprocess.STDOUT))
            running.append(subprocess.Popen(template, cwd=template_dir))
            codes = [running[1].wait(), running[0].wait()]
            doctor_log.seek(0)
            print(
                f"\n---- the doctor's tests (doctor/tests/, run beside the template's) ----\n{doctor_log.read()}",
                end="",
            )
    return 128 + stopped[0] if stopped else status(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
