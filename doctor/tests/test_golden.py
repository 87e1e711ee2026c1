"""The diagnosis of the recorded capture, in every shape diagnose can give it, compared with a record of it.

Issue 37 restructured the doctor's results into typed values (frozen dataclasses, JSON only at the edges), a change
that must change no answer: the `diagnose --json` document, key order and number types included, the text
`step-doctor diagnose` prints and the Markdown of TensorBoard's Text tab are compared, byte for byte, with what the
code wrote before it (tests/data/golden/). Fast and TensorFlow-free, on tests/data/input_bound.xplane.pb.gz laid out
as a run (tests/tab_logs.py), in these variants:

- as_is: xprof's step breakdown;
- trace_figures: xprof's breakdown skipped (analysis.XPROF_MAX_MB), the figures from the trace, and the note;
- large: the note on a profile too large for TensorBoard's Profile tab (analysis.LARGE_MB; its seconds masked);
- gpu_shaped: GPU planes added (scale/diagnose_scale.py, seeded): the device's figures;
- claimed_gpu: a summary.json that says the run trained on a GPU, beside a profile with none (DeviceView.unmeasured);
- unreadable: a truncated copy;
- two_runs: two runs in one folder, the second's summary.json naming a padding share.

A change meant to change an answer records the files again, and says why in its commit:
`cd doctor && python -m tests.test_golden`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from step_doctor.diagnose import analysis, diagnose, render
from step_doctor.tensorboard import text_summary
from step_doctor_dev import diagnose_scale
from tests import tab_logs

GOLDEN = Path(__file__).parent / "data" / "golden"
VARIANTS = ("as_is", "trace_figures", "large", "gpu_shaped", "claimed_gpu", "unreadable", "two_runs")
ROOT = "<ROOT>"


def _logdir(variant: str, root: Path) -> Path:
    """The log folder of one variant under root."""
    logdir = root / variant
    run = logdir / "run"
    path = tab_logs.profile(run)
    if variant == "gpu_shaped":
        shaped = logdir / "gpu" / "plugins" / "profile" / tab_logs.SESSION / "host.xplane.pb"
        diagnose_scale.gpu_shaped(path, shaped, path.stat().st_size / 1e6 + 0.5, seed=0)
        return logdir / "gpu"
    if variant == "claimed_gpu":
        (run / "summary.json").write_text(json.dumps({"device_kind": "gpu", "device": "an NVIDIA L4"}))
    if variant == "unreadable":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    if variant == "two_runs":
        other = logdir / "other"
        tab_logs.profile(other, session="2026_01_02_03_04_06", host="other-host")
        (other / "summary.json").write_text(json.dumps({"device_kind": "cpu", "text": {"padding_share": 0.4}}))
    return logdir


def _masked(text: str, root: Path) -> str:
    text = text.replace(str(root), ROOT)
    text = re.sub(r'"analysis_seconds": [0-9.]+', '"analysis_seconds": 0.0', text)
    return re.sub(r"as it streamed them, in \d+ s\.", "as it streamed them, in N s.", text)


def diagnosed(variant: str, root: Path) -> dict[str, str]:
    """{suffix: text} of one variant: the JSON document, the printed text, each run's Text-tab Markdown."""
    limits = {"trace_figures": ("XPROF_MAX_MB", 0.0), "large": ("LARGE_MB", 0.0)}
    name, value = limits.get(variant, ("XPROF_MAX_MB", analysis.XPROF_MAX_MB))
    kept = getattr(analysis, name)
    setattr(analysis, name, value)
    try:
        document = diagnose(_logdir(variant, root))
    finally:
        setattr(analysis, name, kept)
    markdown = "\n".join(
        f"## {run}\n{text_summary.diagnosis_markdown(run, item)}" for run, item in document.runs.items()
    )
    found = {"json": json.dumps(document.to_json(), indent=2), "txt": render(document), "md": markdown}
    return {suffix: _masked(text, root) + "\n" for suffix, text in found.items()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_diagnosis_is_the_recorded_one(variant, tmp_path):
    for suffix, text in diagnosed(variant, tmp_path).items():
        expected = (GOLDEN / f"{variant}.{suffix}").read_text()
        assert text == expected, f"{variant}.{suffix} differs from tests/data/golden/ (see this module's docstring)"


def record() -> None:
    import tempfile

    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        for variant in VARIANTS:
            for suffix, text in diagnosed(variant, Path(folder)).items():
                (GOLDEN / f"{variant}.{suffix}").write_text(text)
                print(f"recorded {variant}.{suffix}")


if __name__ == "__main__":
    record()
