"""The image workload: classification of images stored as sharded TFRecords (configs/*.yaml).

    settings.py      its config sections: data (where the images come from) and pipeline (every knob)
    pipeline.py      the one image pipeline builder (naive and optimized are presets of its knobs)
    augment.py       the listed transforms, one implementation per placement
    choices.py       the pipeline's `auto`s decided for a dataset and a device (what to cache, where to shuffle)
    data_checks.py   damaged shards found before a run, and named when one fails
    floor.py         the decode floor: decoding alone, what every decoding pipeline pays per image
    tuning.py        the knobs make tune searches for images
    workload.py      WORKLOAD: the interface (train/workloads/base.py) over the modules above

Its sources are train/sources.py (and train/shards/), its models train/models.py: the files a forker edits.
Modules import their siblings by full path; this file re-exports nothing.
"""
