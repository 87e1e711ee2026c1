"""Input-pipeline causes read from one profile's input-wait analysis (diagnose/input_wait.py).

One function per cause. The stage the step waits on decides which cause it is (a Python
generator, files read one after another or slowly, Python inside a map, a map written without
parallelism, per-example augmentation, decoding every epoch, a heavy map, a stage's own work);
a shuffle buffer that refills, cache() after augmentation and nothing running ahead of the model
are read from the whole tree. Fixes come first as plain tf.data (one line), then as this
template's knob. Every estimate says what it assumes; where a host trace cannot tell two causes
apart, the recommendation says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from step_doctor.diagnose import input_wait as iw
from step_doctor.diagnose import stages as st
from step_doctor.diagnose.blame import Blame, Pipeline
from step_doctor.diagnose.cpu_budget import ProcessCpu
from step_doctor.diagnose.recommendation import CORRECTNESS, Causes, gain, ms, pct
from step_doctor.diagnose.wait_record import InputWait, Stage, Wait


def input_causes(wait: Wait, cpu_only: bool, causes: Causes, cpu: ProcessCpu | None = None) -> None:
    """Add the input pipeline's causes of one profile to `causes`; `cpu` what the process used over the profile's
    window, where it was recorded (the estimates' budget: diagnose/cpu_budget.py)."""
    if not isinstance(wait, InputWait) or not wait.measured:
        return
    p = Pipeline(wait, cpu_only, causes, cpu)
    for unit in st.units(p.stages):
        blocking_stage(Blame(unit, p))
    for s in p.stages:
        if s.fill_ms > 0:
            shuffle_buffer_refill(s, p)
    cache_after_augmentation(p)
    no_prefetch(p)


def blocking_stage(b: Blame) -> None:
    """The cause the stage that holds the step stands for."""
    head, stages = b.head, b.pipeline.stages
    if head.kind == "Generator":
        return python_generator(b)
    opens = st.is_opener(head)
    inside = [o for o in stages if o is head or (opens and st.under(o.path, head.path))]
    readers = [o for o in inside if o.kind in iw.READERS]
    if readers:
        reader = max(readers, key=lambda o: o.busy_ms)
        parallel = head.kind in iw.ASYNC or reader.threads > 1
        return slow_file_reads(b, reader) if parallel else sequential_file_reads(b, reader)
    if head.kind not in iw.FUNCTION_STAGES or not b.fn:
        return slow_stage(b)
    if b.shares.get("python", 0.0) >= 0.5:
        return python_in_map(b)
    if st.written_sequential_map(head):
        return sequential_map(b)
    if b.shares.get("augmentation", 0.0) >= 0.4:
        return slow_augmentation(b)
    if b.shares.get("decode", 0.0) >= 0.4:
        return decode_every_epoch(b)
    return heavy_map(b)


SPLIT = (
    " Its function (or one under it that a cache would keep) also runs random or Python ops, so a cache after it "
    "would keep their first draws: split the decode into a map of its own, cache after that map and run the rest "
    "after the cache (`.map(decode).cache().map(augment)`)."
)


def python_generator(b: Blame) -> None:
    if python_tokenizer(b):
        return python_tokenization(b)
    b.add(
        "python-generator",
        "Python generator (from_generator) feeds the pipeline",
        b.spread,
        f"{b.text}: Dataset.from_generator runs your Python one element at a time; " + st.function_line(b.fn),
        "Produce the examples with tf.data ops instead of Python, e.g. "
        "`tf.data.Dataset.from_tensor_slices(paths).map(load, num_parallel_calls=tf.data.AUTOTUNE)` with `load` "
        "built from tf.io.read_file, tf.io.decode_jpeg and tf.image.resize, or read TFRecord shards with "
        "`tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)`. Running more generators in "
        "parallel helps little: Python holds the GIL, so one of them runs Python at a time. "
        "In this template: pipeline.reader: tfrecord, pipeline.parallel_calls: auto.",
        f"Estimate: the same work spread over {b.pipeline.cores_note}; TF ops are usually faster than the Python they "
        "replace, so the real gain can be larger. The trace shows time inside Python, not whether that Python "
        "computed or waited on files." + b.counted,
    )


TOKENIZE_ONCE = (
    "Tokenize once, when the dataset is built, not in every step: adapt a "
    "`keras.layers.TextVectorization(max_tokens=..., output_mode='int')` on the training split "
    "(`vectorize.adapt(train_texts)`), write each text's token ids, unpadded, to TFRecord shards "
    "(`tf.train.Int64List`), and read them with "
    "`tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)"
    ".map(parse, num_parallel_calls=tf.data.AUTOTUNE)`, then `bucket_by_sequence_length(..., "
    "pad_to_bucket_boundary=True)` and `.prefetch(tf.data.AUTOTUNE)`; save the adapted vocabulary with the dataset "
    "and put the layer in front of the exported model, so it serves raw strings. At least, tokenize inside tf.data: "
    "`tf.data.TextLineDataset(files).batch(256).map(vectorize, num_parallel_calls=tf.data.AUTOTUNE).unbatch()` "
    "(TextVectorization runs TensorFlow string ops, which hold no GIL and run in parallel). "
    "In this template (task: text): text.pipeline.reader: tfrecord, text.pipeline.batching: bucket."
)


def python_tokenizer(b: Blame) -> str | None:
    """How the stage runs Python, where that Python makes a text model's input (token ids per element: read from the
    element shapes and types the trace records, stages.token_ids); None where it does not, or the trace cannot tell."""
    if not b.fn or not st.token_ids(b.head):
        return None
    if b.head.kind == "Generator":
        return "Dataset.from_generator runs your Python one element at a time"
    if b.head.kind in iw.FUNCTION_STAGES and b.shares.get("python", 0.0) >= 0.5:
        sequential = "; written without num_parallel_calls" if st.written_sequential_map(b.head) else ""
        return (
            f"{b.shares['python']:.0%} of its function's op time is Python (PyFunc ops: tf.py_function / "
            f"tf.numpy_function){sequential}"
        )
    return None


def python_tokenization(b: Blame) -> None:
    """Python that makes a text model's input, for every step: tokenized once, the stage and its wait are gone."""
    b.add(
        "python-tokenization",
        "Python tokenization feeds the pipeline",
        b.pipeline.removes(b.ms, b.work_below),
        f"{b.text}: its elements are integer sequences ({st.token_ids(b.head)}: token ids of a text model) made in "
        f"Python: {python_tokenizer(b)}; " + st.function_line(b.fn, b.parallelism),
        TOKENIZE_ONCE,
        "Estimate: the wait on this stage leaves the steps (the ids are made once and read back in a parallel map, "
        f"which costs a little that is not counted); tokenizing in a parallel map instead spreads the work over "
        f"{b.pipeline.cores_note}, TF ops usually faster than the Python they replace. The trace records what the "
        "Python made (integer sequences), not how: if it only read ids tokenized before, the fix is the same, "
        "reading them with tf.data.",
    )


def sequential_file_reads(b: Blame, reader: Stage) -> None:
    b.add(
        "sequential-file-reads",
        "Files are read one after another",
        b.pipeline.removes(b.ms * (1 - 1 / b.pipeline.cores)),
        f"{b.text}: {reader.kind} readers inside {b.head.kind} opened {reader.instances} file(s) during the "
        f"profile and read them one after another on one thread ({ms(reader.busy_ms)} of reading per step)",
        "Read several files at once: `tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)`, or "
        "`tf.data.Dataset.from_tensor_slices(files).interleave(tf.data.TFRecordDataset, cycle_length=8, "
        "num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)`. "
        "In this template: pipeline.parallel_reads: auto.",
        f"Estimate: reading spread over {b.pipeline.cores_note}. A host trace cannot tell waiting on storage from "
        "decompressing or parsing inside the reader (both are the reader's own time): on network storage "
        "parallel reads hide latency and can gain more; compressed files (GZIP/ZLIB) gain as far as cores "
        "allow.",
    )


def slow_file_reads(b: Blame, reader: Stage) -> None:
    b.add(
        "slow-file-reads",
        "Reading files is slow even in parallel",
        b.pipeline.removes(b.ms, b.work_below),
        f"{b.text}: {reader.kind} readers under {b.head.kind} read {reader.instances} file(s) on "
        f"{reader.threads} threads",
        "Read once and keep: `.cache()` after decoding (or `.cache(filename)` on local disk), fewer and larger "
        "shards (100-200 MB), uncompressed records on fast local disk. In this template: pipeline.cache: auto.",
        "Estimate: the reads vanish after the first epoch under a cache. The trace cannot tell storage latency "
        "from decompression on the CPU.",
    )


def slow_stage(b: Blame) -> None:
    b.add(
        "slow-stage",
        f"The {b.head.kind} stage holds the step",
        b.pipeline.removes(b.ms * 0.5),
        f"{b.text}, work of its own (no function of yours ran in it)",
        "Measure that stage alone (iterate the dataset without the model) and move it before `.cache()` or after "
        "`.batch()` so it runs once per batch. In this template: `python -m train bench` compares pipelines.",
        "Estimate: half of its time, a guess: the trace shows where the time goes, not how much a change saves.",
    )


def python_in_map(b: Blame) -> None:
    if python_tokenizer(b):
        return python_tokenization(b)
    b.add(
        "python-in-map",
        "Python inside a map (tf.py_function / tf.numpy_function)",
        b.spread,
        f"{b.text}: {b.shares['python']:.0%} of its op time is Python (PyFunc ops: tf.py_function / "
        "tf.numpy_function); "
        + b.ran
        + ("; written without num_parallel_calls" if st.written_sequential_map(b.head) else ""),
        "Rewrite the function with TensorFlow ops (tf.io.decode_jpeg, tf.image.*, tf.strings.*) and run it with "
        "`.map(f, num_parallel_calls=tf.data.AUTOTUNE)`. `num_parallel_calls` alone helps little while the "
        "function is Python: the GIL lets one call run Python at a time (only what releases the GIL, file reads, "
        "sleeps, large numpy operations, overlaps). If it must stay Python, run it once offline and store the "
        "result (TFRecord), or spread it over processes (tf.data service). In this template: pipeline.reader: "
        "tfrecord, pipeline.parallel_calls: auto, pipeline.data_service.",
        f"Estimate: the same work without the GIL, over {b.pipeline.cores_note}; TF ops are usually faster than the "
        "Python they replace. The trace shows time inside Python, not whether it computed or waited on I/O."
        + b.counted,
    )


def sequential_map(b: Blame) -> None:
    step, budget = b.pipeline.step, b.pipeline.budget
    parallel = (
        b.spread,
        f"write `.map(f, num_parallel_calls=tf.data.AUTOTUNE)` (removes about {ms(b.spread)} per step here: "
        f"{gain(step, b.spread):.2f}x)",
    )
    options = [parallel]
    removes = {"parallel-calls": b.spread}
    if b.deterministic:
        options.append((b.cached, f"{b.cache_line} (up to {ms(b.cached)} per step: {gain(step, b.cached):.2f}x)"))
        removes["cache"] = b.cached
    options.sort(key=lambda o: -o[0])  # the fix that gains most first: one the cores cannot use is not
    rescued = (
        f"tf.data parallelized it itself (map parallelization; parallelism {b.parallelism}), so on these cores "
        "`num_parallel_calls` adds little here but keeps it parallel where that optimization does not apply and "
        "lets autotune use every core of a larger host"
        if b.concurrency >= 1.3
        else "so one call runs at a time"
    )
    busy = (
        f"; the cores are {budget.busy:.0%} busy, so spreading the work gains little here"
        + (" and doing less of it (a cache) gains what it frees" if b.deterministic else "")
        if budget.saturated
        else ""
    )
    fix = ". Then: ".join(text[0].upper() + text[1:] if i == 0 else text for i, (_, text) in enumerate(options)) + "."
    fix += b.uncached
    fix += " In this template: pipeline.parallel_calls: auto" + (", pipeline.cache: auto." if b.deterministic else ".")
    b.add(
        "sequential-map",
        "A map written without num_parallel_calls",
        options[0][0],
        f"{b.text}: a map written without num_parallel_calls (MapDataset), {rescued}; {b.ran}{busy}",
        fix,
        f"Estimate: parallel calls spread the work over {b.pipeline.cores_note}"
        + (
            f", a cache removes the {ms(b.work_below)} of CPU per step it and what it reads use; both"
            if b.deterministic
            else ";"
        )
        + f" within the cores' budget: {budget.words}. On a CPU-only profile "
        "the map and the model share those cores, so whether the map is slow by itself or starved by the model "
        "cannot be told apart here." + b.counted,
        removes=removes,
    )


def slow_augmentation(b: Blame) -> None:
    b.add(
        "slow-augmentation",
        "Per-example augmentation is slower than the model",
        b.pipeline.removes(b.worked, b.fn.ops_ms.get("augmentation", 0.0)),
        f"{b.text}: {b.shares['augmentation']:.0%} of its op time is augmentation, applied per example; {b.ran}",
        "Augment whole batches: `.batch(256).map(augment_batch, num_parallel_calls=tf.data.AUTOTUNE)` with ops "
        "that take a batch (one op call per batch instead of one per image), or move augmentation into the "
        "model as Keras layers (keras.layers.RandomFlip, RandomContrast, ...) so the accelerator runs it. "
        "In this template: pipeline.augment: batched (or device).",
        "Estimate: the augmentation leaves the input pipeline (into the model on an accelerator). "
        + (
            "On this CPU-only profile the model runs on the same cores, so moving it moves the work rather than "
            "removing it; batching it is what saves CPU here."
            if b.pipeline.cpu_only
            else ""
        )
        + b.counted,
    )


def decode_every_epoch(b: Blame) -> None:
    # a cache of a split-off decode keeps the decode alone: its share of the stage's own wait and work
    decode = b.shares["decode"]
    removes = b.cached if b.deterministic else b.pipeline.removes(b.worked * decode, b.fn.work_ms * decode)
    b.add(
        "decode-every-epoch",
        "Decoding every example every epoch",
        removes,
        f"{b.text}: {decode:.0%} of its op time decodes; {b.ran}",
        "`.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()` keeps decoded examples after the first "
        "epoch; if they do not fit in memory, decode at reduced size (`tf.io.decode_jpeg(data, ratio=2)`, "
        "`tf.io.decode_and_crop_jpeg`) or `.cache(filename)`."
        + ("" if b.deterministic else SPLIT)
        + " In this template: pipeline.cache: auto, pipeline.scaled_decode, pipeline.random_crop.",
        (
            "Estimate: decoding vanishes after the first epoch under a cache" + b.below_note + "."
            if b.deterministic
            else f"Estimate: the decode's share of its work and wait ({decode:.0%}) vanishes after the first epoch."
        )
        + b.counted,
    )


def heavy_map(b: Blame) -> None:
    more_cores = (
        "`.map(f, num_parallel_calls=tf.data.AUTOTUNE)` on a host with more cores, or tf.data service workers "
        "(`ds.apply(tf.data.experimental.service.distribute(...))`)"
    )
    if b.deterministic:
        fix = (
            f"{b.cache_line[0].upper()}{b.cache_line[1:]}. Otherwise give the pipeline more cores: {more_cores}. "
            "In this template: pipeline.cache: auto, pipeline.data_service."
        )
        caveat = f"the map vanishes after the first epoch under a cache{b.below_note}."
    else:
        fix = (
            f"Give the pipeline more cores: {more_cores}; or move the work into the model (on the accelerator) "
            f"or offline.{b.uncached} In this template: pipeline.data_service."
        )
        caveat = f"the work over {b.pipeline.cores_note}."
    b.add(
        "heavy-map",
        "A map does more work than the model",
        b.cached if b.deterministic else b.spread,
        f"{b.text}: {b.ran}",
        fix,
        "Estimate: " + caveat + b.counted,
        removes={"cache": b.cached} if b.deterministic else {"parallel-calls": b.spread},
    )


def shuffle_buffer_refill(s: Stage, p: Pipeline) -> None:
    below = [o for o in p.stages if st.under(o.path, s.path) and o.functions]
    work = ", ".join(f"{o.kind} ({', '.join(f'{op} {ms(t)}' for op, t in o.functions.top_ops[:2])})" for o in below[:2])
    # Shuffling earlier removes the burst, not the work: each element is still decoded once per epoch, now in
    # the steady state, spread over the cores.
    redone = sum(o.functions.work_ms for o in below) / p.cores
    size = ""
    if s.element_mb:
        buffer = s.params.get("buffer_size")
        total = f", about {s.element_mb * float(buffer):.0f} MB in all" if str(buffer).isdigit() else ""
        size = f"; each buffered element takes {s.element_mb:.2f} MB{total}"
    tokenizer = next((o for o in below if python_tokenizer(Blame(st.Unit(o, [o], o.blocking_ms), p))), None)
    if tokenizer is not None:
        return _shuffle_of_python_tokens(s, p, tokenizer, work, size)
    p.causes.add(
        "shuffle-buffer-refill",
        "A shuffle buffer of expensive elements is refilled",
        p.removes(max(s.fill_ms - redone, 0.0)),
        f"{ms(s.fill_ms)} per step ({pct(s.fill_ms, p.step)} of step time) waits while {st.name(s)} fills "
        f"its buffer of {s.params.get('buffer_size', '?')} elements: {s.fills} fill(s) in the profile (each new "
        f"iterator, e.g. every epoch), {s.pulled_per_fill:.0f} elements pulled one by one"
        + (f" through {work}" if work else "")
        + size,
        "Shuffle before the expensive work, so the buffer holds file names or encoded records: "
        "`tf.data.Dataset.from_tensor_slices(paths).shuffle(len(paths))"
        ".map(load, num_parallel_calls=tf.data.AUTOTUNE)`; or resize before the shuffle so the buffer holds "
        "small images. In this template: pipeline.shuffle_before_decode: true."
        + (
            f" The work itself stays ({ms(redone * p.cores)} of CPU per step): `.cache()` after decoding and resizing "
            "removes it from later epochs."
            if redone
            else ""
        ),
        f"Estimate: the fills vanish and their work ({ms(redone * p.cores)} of CPU per step) is done in the steady "
        f"state instead, over {p.cores_words}. Shuffling file names shuffles less finely within a file (not at all "
        "for one image per file).",
        stage=s.path,
    )


def _shuffle_of_python_tokens(s: Stage, p: Pipeline, tokenizer: Stage, work: str, size: str) -> None:
    """A shuffle buffer filled from Python tokenization: tokenized once, it fills from token ids read back."""
    p.causes.add(
        "shuffle-buffer-refill",
        "A shuffle buffer is refilled from Python tokenization",
        p.removes(s.fill_ms),
        f"{ms(s.fill_ms)} per step ({pct(s.fill_ms, p.step)} of step time) waits while {st.name(s)} fills "
        f"its buffer of {s.params.get('buffer_size', '?')} elements: {s.fills} fill(s) in the profile (each new "
        f"iterator, e.g. every epoch), {s.pulled_per_fill:.0f} elements pulled one by one through {work}, "
        f"tokenized in Python by {st.name(tokenizer)} ({st.token_ids(tokenizer)}: token ids){size}",
        TOKENIZE_ONCE + " The buffer then fills from token ids read back, which costs little.",
        "Estimate: the fill's Python work leaves the steps (reading the ids back is not counted).",
        stage=s.path,
    )


def cache_after_augmentation(p: Pipeline) -> None:
    for cache in (s for s in p.stages if st.is_cache(s)):
        for s in p.stages:
            fn = s.functions
            if not st.under(s.path, cache.path) or not fn or not fn.ops_ms.get("augmentation"):
                continue
            ops = [op for op, _ in fn.top_ops if iw.op_category(op) == "augmentation"]
            p.causes.add(
                "cache-after-augmentation",
                "cache() stores augmented examples",
                0.0,
                f"{st.name(cache)} caches the output of {st.name(s)}, whose function ran augmentation ops "
                f"({', '.join(ops) or 'augmentation'}: {ms(fn.ops_ms['augmentation'])} per step) and was being "
                f"cached in this profile ({pct(s.blocking_ms, p.step)} of step time waits on it): if those ops are "
                "random (tf.image.random_*, Keras random layers), every epoch after the first replays the first "
                "epoch's augmented examples, and the model sees no new augmentation",
                "Cache before the random ops: "
                "`ds.map(decode).cache().map(augment, num_parallel_calls=tf.data.AUTOTUNE)` (augment batches after "
                "`.batch()` to keep the per-epoch cost low). In this template: pipeline.cache with pipeline.augment: "
                "batched (augmentation runs after the cache).",
                "This changes what is learned, not the speed: it ranks first. Random-number ops are too cheap for the "
                "profiler to record, so the profile cannot show whether these ops were random or fixed "
                "(tf.image.flip_left_right is not): check the function. After the move, the augmentation runs every "
                "epoch.",
                kind=CORRECTNESS,
                stage=s.path,
            )
            return


def root_stage(stages: Sequence[Stage]) -> Stage | None:
    """The stage the model reads from: the first under Root that does work of its own."""
    return next((s for s in stages if s.path.count("::") >= 1 and not s.pass_through), None)


def prefetched(stage: Stage, stages: Sequence[Stage]) -> bool:
    """Whether a Prefetch (yours or injected by tf.data) runs `stage` ahead of its consumer."""
    return any(o.kind == "Prefetch" and st.under(stage.path, o.path) for o in stages)


def no_prefetch(p: Pipeline) -> None:
    """Nothing runs ahead of the model at the root: its stage is synchronous and no Prefetch sits above it."""
    top = root_stage(p.stages)
    if p.input_ms <= 0 or top is None or top.asynchronous or prefetched(top, p.stages):
        return  # the stage the model reads from already runs ahead of it
    deeper = [s for s in p.stages if s.kind == "Prefetch"]
    if deeper:  # a prefetch further down (before .batch(), say) already overlaps what lies below it
        above = sum(s.blocking_ms + s.fill_ms for s in p.stages if not s.pass_through and not prefetched(s, p.stages))
        where = f"the Prefetch at {deeper[0].path} runs only what lies below it ahead"
    else:
        above = p.input_ms
        autotune = " (autotune is off, so tf.data injected none)" if p.wait.autotune is False else ""
        where = f"no Prefetch anywhere in the pipeline{autotune}"
    p.causes.add(
        "no-prefetch",
        "Nothing runs ahead of the model (no prefetch)",
        p.removes(min(above, p.other_ms)),
        f"{where}: the stage the model reads from, {st.name(top)}, is synchronous, so every batch is produced while "
        f"the model waits: {ms(above)} per step, against {ms(p.other_ms)} of step that could overlap it",
        "End the pipeline with `.prefetch(tf.data.AUTOTUNE)`. In this template: pipeline.prefetch: auto.",
        "Estimate: production overlaps the rest of the step (it can hide at most that much)."
        + (
            " On a CPU-only profile the pipeline and the model then share the cores, so the overlap is partial."
            if p.cpu_only
            else ""
        ),
        stage=top.path,
    )
