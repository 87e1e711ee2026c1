"""The doctor's developer tools, beside its tests in a checkout and never in its wheel: what diagnose and profile
cost (bench_diagnose, bench_profile, survival), the profiles they write (diagnose_scale, xspace_writer), and a fake
NVML for machines without a GPU (fake_nvml). Run from the repository's root with `PYTHONPATH=doctor` (the Makefile's
bench-diagnose and bench-profile do), or from doctor/."""
