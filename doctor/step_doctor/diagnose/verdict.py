"""The verdict on one profile, and the regression gate's rule: both read the same threshold.

Waiting for input 20 % of step time or more is input-bound (xprof's own "HIGHLY input-bound"
threshold). Otherwise the step is device-bound when the accelerator (or, in a CPU-only profile,
the CPU) computes most of it, host-bound when per-step overhead does (of the step without its stall,
diagnose/stalls.py), or compiling the step with XLA and per-step overhead together (the compiler
runs on the host, and a step that compiles is not computing: diagnose/xla.py), and only not-input-bound
where a device was there but its share of the step is not measured (diagnose/device.py).
"""

from __future__ import annotations

from step_doctor.diagnose.analysis import INPUT_BOUND_HIGH as INPUT_BOUND
from step_doctor.diagnose.device import DeviceView, view
from step_doctor.diagnose.profile_record import Profile
from step_doctor.diagnose.stalls import left_out
from step_doctor.diagnose.wait_record import InputWait

HOST_BOUND = 0.5  # per-step overhead's share of a CPU-only step from which it is host-bound


def host_share(profile: Profile) -> float:
    """Of a CPU-only step without its stall, the share per-step overhead and compiling take (0 where unmeasured)."""
    wait = profile.wait
    if not isinstance(wait, InputWait):
        return 0.0
    working = profile.step_time_ms - left_out(wait)
    return ((wait.overhead_ms or 0.0) + (wait.compile_ms or 0.0)) / working if working > 0 else 0.0


def verdict(profile: Profile, device: DeviceView | None = None) -> str:
    """input-bound, device-bound, host-bound; not-input-bound where a device's share is unmeasured; unknown."""
    device = device or view(profile)
    share = profile.input_bound_percent
    if share is None or not profile.step_time_ms:
        return "unknown"
    if share >= INPUT_BOUND:
        return "input-bound"
    if device.cpu_only:  # the CPU is the compute device
        return "host-bound" if host_share(profile) >= HOST_BOUND else "device-bound"
    if device.busy_percent is None:
        return "not-input-bound"
    return "device-bound" if device.busy_percent >= 50 else "host-bound"


def fails_gate(share: float | None, threshold: float) -> bool:
    """Whether `--fail-if-input-bound threshold` fails a run that waits `share` % of its step for input.

    At the threshold, as the verdict: a gate at 20 fails exactly the runs the verdict calls input-bound.
    """
    return share is not None and share >= threshold
