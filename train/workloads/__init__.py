"""Workloads: one folder per kind of data and model (image, text), behind one interface."""
