"""The analyser: offline, without TensorFlow, from any log folder that holds a profile.

xprof conversion (analysis.py) -> host trace (hosttrace.py) -> steps, marked or inferred
(step_windows.py) -> input wait down the tf.data iterator tree (input_wait.py, a typed record:
wait_record.py), step time with no recorded work kept apart (stalls.py) -> the profile's record
(profile_record.py) -> causes in the input pipeline (input_causes.py, over blame.py and stages.py)
and in the step (step_causes.py), typed and ranked (recommendation.py, ranked_causes.py) -> verdict
(verdict.py) -> the diagnosis (report.py, typed: diagnosis.py), its text (rendering.py) and the
command with its exit status (command.py). Results are frozen dataclasses throughout; each has a
`to_json()` that writes its part of the `diagnose --json` document, called only at the edges.

The public API, here: diagnose(logdir) -> Diagnosis (its to_json() is the `diagnose --json` document),
render(diagnosis) -> str, gate(diagnosis, fail_if_input_bound=..., allow_unmeasured=...) -> exit status,
main(logdir, as_json=..., fail_if_input_bound=..., allow_unmeasured=...) -> exit status.
"""

from step_doctor.diagnose.command import gate, main
from step_doctor.diagnose.diagnosis import Diagnosis, RunDiagnosis, UnreadableRun
from step_doctor.diagnose.rendering import render
from step_doctor.diagnose.report import diagnose

__all__ = ["Diagnosis", "RunDiagnosis", "UnreadableRun", "diagnose", "gate", "main", "render"]
