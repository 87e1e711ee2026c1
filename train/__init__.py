"""A TensorFlow/Keras training template that shows, measures and fixes low GPU utilization.

The package follows the data flow (docs/layout.md); each layer imports only the layers under it,
and any of them may import the doctor (step_doctor), which imports nothing of this package
(pyproject.toml's import-linter contracts, checked by `make lint`):

    cli/          `python -m train ...` / `gpu-template ...`: one module per group of commands; k8s, lint
    benchmarks/   trials -> compare, bench, ladder, sweep-batch, tune, and their reports
    training/     one run set-up -> the Keras fit loop or the multi-worker loop; checkpoints, guards
    measure/      in-run measurement (Keras callbacks): step time, NVML/CPU sampling to TensorBoard
    input/        the one pipeline builder, augmentation, the tf.data service
    sources.py    where datasets come from (a forker adds a source here)
    shards/       the dataset side: spec, catalog of sources, record format (write and read), integrity
    scenario.py   the overlay every variant of a comparison gets (configs/scenarios/)
    config.py     every knob, typed and documented (a forker edits the presets in configs/)
    models.py     the model registry + loss, optimizer, metrics (a forker adds a model here)
    core/         errors, atomic files, quiet TensorFlow import, where one command leaves what another reads
"""
