"""Both products' tests at once: the template's (tests/) and the doctor's (doctor/tests/, run from doctor/).

    python tests/run_both.py MARKERS [PYTEST_ARGS ...]

`make test-fast` runs its two pytest sessions side by side: each keeps about one core busy (its
wall time and CPU time agree within a few per cent), so on 2 cores the pair takes little more than
the longer of the two. The template's output streams as it runs, the doctor's follows when both
have ended; the exit status is the first non-zero one. `make test` runs them one after the other,
because the doctor's slow tests profile models whose verdicts need the machine to themselves.
Ctrl-C or SIGTERM stops both and exits 130 or 143.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    markers, rest = argv[0], argv[1:]
    pytest = [sys.executable, "-m", "pytest"]
    with tempfile.TemporaryFile("w+") as doctor_log:
        doctor = subprocess.Popen(
            [*pytest, "-m", f"{markers} and not install", *rest],
            cwd=ROOT / "doctor",
            stdout=doctor_log,
            stderr=subprocess.STDOUT,
        )
        template = subprocess.Popen([*pytest, "-m", markers, *rest], cwd=ROOT)
        stopped = []

        def stop(signum, _frame):
            stopped.append(signum)
            for child in (template, doctor):
                if child.poll() is None:
                    child.send_signal(signum)

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        codes = [template.wait(), doctor.wait()]
        doctor_log.seek(0)
        print(f"\n---- the doctor's tests (doctor/tests/, run beside the template's) ----\n{doctor_log.read()}", end="")
    if stopped:
        return 128 + stopped[0]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
