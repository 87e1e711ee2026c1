"""The analyser: offline, without TensorFlow, from any log folder that holds a profile.

xprof conversion (analysis.py) -> host trace (hosttrace.py) -> steps, marked or inferred
(step_windows.py) -> input wait down the tf.data iterator tree (input_wait.py, a typed record:
wait_record.py), step time with no recorded work kept apart (stalls.py) -> causes in the input
pipeline (input_causes.py, over blame.py and stages.py) and in the step (step_causes.py), typed
and ranked (recommendation.py, recommend.py) -> verdict (verdict.py) -> the document (report.py),
its text (rendering.py) and the command with its exit status (command.py).

The public API, here: diagnose(logdir) -> dict (the `diagnose --json` document),
render(document) -> str, main(logdir, as_json=..., fail_if_input_bound=..., allow_unmeasured=...)
-> exit status.
"""

from step_doctor.diagnose.command import main
from step_doctor.diagnose.rendering import render
from step_doctor.diagnose.report import diagnose

__all__ = ["diagnose", "main", "render"]
