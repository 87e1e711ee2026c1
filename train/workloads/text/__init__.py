"""The text workload: classification of raw text, where GPUs starve on Python tokenization, padding
and recompilation.

    settings.py      the typed knobs of the text data and the text pipeline (the config's `text:` section)
    corpus.py        the built-in data: a seeded synthetic corpus that behaves like real text
    raw_shards.py    raw text as JSONL shards (what the naive pipeline reads)
    user_text.py     your own text: a CSV or JSONL file, or a folder of .txt files per class
    vocabulary.py    the TextVectorization layer, its saved vocabulary, and the same tokenizer in Python
    token_records.py token ids + label as tf.train.Example records
    spec.py          TextSpec: what the pipeline and the model need to know about a built text dataset
    build.py         source -> raw shards -> vocabulary -> token-id shards -> spec, once, atomically
    buckets.py       bucket boundaries and per-bucket batch sizes under a token budget
    packing.py       several examples per row, with segment ids and positions
    pipeline.py      the one text pipeline builder (naive and optimized are presets of its knobs)
    model.py         the text models, registered by name without TensorFlow; serving raw strings
    layers.py        their Keras layers: a Transformer encoder that respects the padding (and segment) mask
    figures.py       real tokens, padded slots, padding share and distinct shapes of a pipeline's batches
    meter.py         what a text run measures as it trains: real tokens/s, padding, shapes, XLA compiles
    report.py        what compare and bench show of text: tokens, padding, shapes; CPU time per real token
    tuning.py        the knobs make tune searches for text
    workload.py      WORKLOAD: the interface (train/workloads/base.py) over the modules above

Modules import their siblings by full path; this file re-exports nothing.
"""
