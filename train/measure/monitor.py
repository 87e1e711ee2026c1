"""The utilization sampler as a Keras callback: a running Sampler's samples as TensorBoard scalars.

The sampler itself (NVML, GPM, CPU) is the doctor's step_doctor/sampler.py, which imports neither Keras nor
TensorFlow (`step-doctor profile` samples from outside the training process); its names are
re-exported here for the callers that know them from this module.
"""

from __future__ import annotations

from pathlib import Path

import keras

from step_doctor.sampler import GPM_KEYS, GPM_METRICS, GPU_KEYS, GpmReader, Sampler, SampleWriter

__all__ = ["GPM_KEYS", "GPM_METRICS", "GPU_KEYS", "GpmReader", "MonitorCallback", "Sampler"]


class MonitorCallback(keras.callbacks.Callback):
    """Writes a running Sampler's samples as TensorBoard scalars (the caller starts and stops it)."""

    def __init__(self, sampler: Sampler, logdir: Path, log=print):
        super().__init__()
        self.sampler = sampler
        self.logdir = logdir
        self.log = log
        self._writer = None

    def on_train_begin(self, logs=None):
        if self._writer is None:
            self._writer = SampleWriter(self.logdir, ".monitor")
            if not self.sampler.gpu_available:
                self.log(f"GPU utilization: unavailable ({self.sampler.gpu_unavailable_reason}); sampling CPU only.")
            elif self.sampler.gpm_unavailable_reason:
                self.log(f"SM and tensor-core activity: unavailable ({self.sampler.gpm_unavailable_reason}).")

    def on_epoch_end(self, epoch, logs=None):
        self._write()

    def on_train_end(self, logs=None):
        self._write()

    def _write(self):
        self._writer.write(self.sampler.samples)
