"""What a run measures about itself while it trains (Keras callbacks): step time, and NVML/GPM and CPU
sampling written to TensorBoard. The profile window with step markers, the sampler itself and the offline
analysis of what a run wrote are the doctor's (step_doctor.callbacks, step_doctor.sampler, step_doctor.diagnose)."""
