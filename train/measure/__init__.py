"""What a run measures about itself while it trains (Keras callbacks): step time, the profile window with
step markers, NVML/GPM and CPU sampling. The offline analysis of what it wrote is train/diagnose/."""
