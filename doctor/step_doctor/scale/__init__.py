"""What `diagnose` costs against the size of the profile (`step-doctor bench-diagnose`), on real captures and
GPU-shaped profiles written by a synthetic XSpace writer."""
