"""A TensorFlow/Keras training template that shows, measures and fixes low GPU utilization.

The package follows the data flow (see README, "How it works"):

    config.py, models.py, sources.py   what a forker edits: knobs, models + loss/optimizer/metrics, data sources
    input/        shards -> records -> the one pipeline builder -> augmentation -> tf.data service
    training/     one run set-up (setup.py) -> the Keras fit loop or the multi-worker loop; checkpoints, guards
    measure/      step timing, profiles with step markers, NVML/CPU sampling, xprof analysis, diagnose
    benchmarks/   trials -> compare, bench, ladder, sweep-batch, and their reports
    cli.py        `python -m train ...` / `gpu-template ...`
"""
