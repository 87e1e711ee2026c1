"""`step-doctor diagnose`: print the diagnosis, apply the regression gate, return the exit status.

Exit status: 0; 3 when --fail-if-input-bound finds a run at or above its threshold; 4 when a
run could not be measured (unreadable profile, or no input share) and the gate was asked for,
or when a profile is unreadable, unless --allow-unmeasured.
"""

from __future__ import annotations

import json
import sys

from step_doctor.diagnose.diagnosis import Diagnosis, RunDiagnosis
from step_doctor.diagnose.rendering import render
from step_doctor.diagnose.report import diagnose
from step_doctor.diagnose.verdict import fails_gate

INPUT_BOUND = 3
UNMEASURED = 4


def main(
    logdir: str,
    as_json: bool = False,
    fail_if_input_bound: float | None = None,
    allow_unmeasured: bool = False,
) -> int:
    result = diagnose(logdir)
    print(json.dumps(result.to_json(), indent=2) if as_json else render(result))
    return gate(result, fail_if_input_bound, allow_unmeasured)


def gate(result: Diagnosis, fail_if_input_bound: float | None = None, allow_unmeasured: bool = False) -> int:
    """The exit status of a diagnosis (see the module's docstring), with a line on stderr for each failure."""
    unmeasured = [
        (run, (item.unmeasured or "no input share") if isinstance(item, RunDiagnosis) else "unreadable profile")
        for run, item in result.runs.items()
        if not isinstance(item, RunDiagnosis) or item.profile.input_bound_percent is None
    ]
    status = 0
    if fail_if_input_bound is not None:
        over = [
            (run, item.profile.input_bound_percent)
            for run, item in result.runs.items()
            if isinstance(item, RunDiagnosis) and fails_gate(item.profile.input_bound_percent, fail_if_input_bound)
        ]
        if over:
            names = ", ".join(f"{run} ({share:.1f}%)" for run, share in over)
            print(f"FAIL: input-bound at or above {fail_if_input_bound}% of step time: {names}", file=sys.stderr)
            status = INPUT_BOUND
    gated = fail_if_input_bound is not None
    blocking = [(run, why) for run, why in unmeasured if gated or why == "unreadable profile"]
    if blocking and not allow_unmeasured:
        names = "; ".join(f"{run}: {why}" for run, why in blocking)
        print(
            f"FAIL: could not measure the input share of {names}. The gate passes only what it measured; "
            "--allow-unmeasured lets such runs through.",
            file=sys.stderr,
        )
        status = status or UNMEASURED
    return status
