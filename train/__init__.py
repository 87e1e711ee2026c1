"""A TensorFlow/Keras training template that shows, measures and fixes low GPU utilization.

The package follows the data flow (see README, "How it works"); each layer imports only the layers
under it (pyproject.toml's import-linter contracts, checked by `make lint`):

    cli/          `python -m train ...` / `gpu-template ...`: one module per group of commands
    benchmarks/   trials -> compare, bench, ladder, sweep-batch, tune, and their reports
    training/     one run set-up -> the Keras fit loop or the multi-worker loop; checkpoints, guards
    measure/      in-run measurement (Keras callbacks): step time, profile window, NVML/CPU sampling
    diagnose/     the offline analyser: profile -> steps -> input wait -> causes -> verdict
    input/        the one pipeline builder, augmentation, the tf.data service
    sources.py    where datasets come from (a forker adds a source here)
    shards/       the dataset side: spec, catalog of sources, record format (write and read), integrity
    scenario.py   the overlay every variant of a comparison gets (configs/scenarios/)
    config.py     every knob, typed (a forker edits the presets in configs/)
    models.py     the model registry + loss, optimizer, metrics (a forker adds a model here)
    core/         errors, atomic files, quiet TensorFlow import, the step-counting callback base
"""
