"""What the run and its profile say about the device: CPU only, a device with figures, or one whose trace is missing.

The input wait comes from host events and stands in every case. The device's share of the step
comes from xprof's step breakdown of the device trace, which a GPU run can lack: CUPTI refuses
to trace the GPU (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) where the driver restricts profiling to
admins, its default, as inside a container without SYS_ADMIN. The profile then holds host events
only and looks CPU-only; the run's own record (summary.json, which this template writes, and
`device_kind` in it) says a GPU was there. A device-busy figure of zero would be false then: the
share is unmeasured, and the diagnosis says why and how to get it. The profiler writes what went
wrong into the profile itself (XSpace `errors`, e.g. "Insufficient privilege to run libcupti (you
need root permission)."): quoted where the device trace is missing, and on its own enough to tell a
GPU run whose trace was refused from a CPU-only one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from step_doctor.diagnose.profile_record import Profile

CUPTI_FIX = (
    "TensorFlow's GPU tracer (CUPTI) recorded nothing: drivers restrict GPU profiling to admins by default "
    "(NVreg_RestrictProfilingToAdminUsers=1, since 418.43), so a process that is not root with SYS_ADMIN is "
    "refused (its log says CUPTI_ERROR_INSUFFICIENT_PRIVILEGES); inside a container a non-root user gets no "
    "capabilities from cap_add. Fix: profile as root with `--cap-add SYS_ADMIN` (Compose: `user: root` and "
    "`cap_add: [SYS_ADMIN]`), or on the host set `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in "
    "/etc/modprobe.d/ and reload the driver. The input wait above comes from host events and stands; the device's "
    "share of the step, and the causes that need it, cannot be measured from this profile."
)


@dataclass(frozen=True)
class DeviceView:
    cpu_only: bool  # the CPU computes the model: no device in the profile, none in the run's record
    busy_percent: float | None  # share of step time the device computes, where measured
    unmeasured: str | None  # why a device's share is not measured, and how to measure it

    def to_json(self) -> dict:
        return asdict(self)


def run_record(session: Path) -> dict:
    """The run's summary.json beside its profile (this template's runs write one), or {}."""
    run_dir = Path(session).parent.parent.parent
    for candidate in (run_dir / "summary.json", run_dir.parent / "summary.json"):
        if candidate.is_file():
            try:
                values = json.loads(candidate.read_text())
            except (ValueError, OSError):
                return {}
            return values if isinstance(values, dict) else {}
    return {}


REFUSED = ("insufficient privilege", "cupti_error_insufficient_privileges")  # the profiler's words for a refused trace
NOT_LOADED = "failed to load libcupti"  # a GPU was found but its tracing library was not
CUPTI_MISSING = (
    "TensorFlow found a GPU but could not load CUPTI, the library its GPU tracer needs: put the CUDA toolkit's "
    "CUPTI (extras/CUPTI/lib64, or the nvidia-cuda-cupti wheel's lib folder) on LD_LIBRARY_PATH, or profile in "
    "an image that ships it (NVIDIA's TensorFlow containers, which this template's Dockerfile builds on)."
)


def _said(profile: Profile) -> str:
    """What the profiler reported while capturing (the profile's XSpace errors), quoted, or ""."""
    errors = profile.profiler_errors
    if not errors:
        return ""
    return " The profiler itself reported: " + "; ".join(f'"{e.strip()}"' for e in errors[:3]) + "."


def view(profile: Profile, record: dict | None = None) -> DeviceView:
    """What the profile and the run's record (run_record) say about the device."""
    record = record or {}
    has_device = profile.device_busy_percent is not None
    errors = [e.lower() for e in profile.profiler_errors]
    refused = any(word in e for e in errors for word in REFUSED)
    not_loaded = any(NOT_LOADED in e for e in errors)
    if not has_device and (record.get("device_kind") == "gpu" or refused or not_loaded):
        gpu = record.get("device") or "a GPU"
        why = "its summary.json says so" if record.get("device_kind") == "gpu" else "the profiler's errors say so"
        return DeviceView(
            False,
            None,
            f"No device trace: the run trained on {gpu} ({why}), but this profile holds host events only."
            f"{_said(profile)} {CUPTI_MISSING if not_loaded and not refused else CUPTI_FIX}",
        )
    if not has_device:
        return DeviceView(True, None, None)
    if not profile.has_step_markers:
        return DeviceView(
            False,
            None,
            f"The device's share is not measured: this {profile.hardware_type} profile has a device plane, but "
            "xprof found no steps of its own in it (no step markers, or a device trace without events), so it "
            f"breaks no step down into device compute. Add step markers; if it has them, the device trace is empty: "
            f"{CUPTI_FIX}",
        )
    if not profile.breakdown.device_compute_ms:
        return DeviceView(
            False,
            None,
            f"No device trace: this {profile.hardware_type} profile's device plane holds no compute in any "
            f"step.{_said(profile)} {CUPTI_FIX}",
        )
    return DeviceView(False, profile.device_busy_percent, None)
