"""Input-pipeline causes read from one profile's input-wait analysis (train/diagnose/input_wait.py).

Each recommendation names one cause the profile shows, with this profile's figures, the step
time its fix would remove and the estimated gain: step time / (step time - time removed),
per example. Fixes come first as plain tf.data (one line), then as this template's knob.
Ranking: a cause that changes what the model learns comes first; then the most step time
removed. A fix estimated to gain less than 5 % is left out. Every estimate says what it
assumes; where a host trace cannot tell two causes apart, the recommendation says so.
"""

from __future__ import annotations

import re

from train.diagnose import input_wait as iw

MIN_GAIN = 1.05  # leave out fixes that would gain less than this (a share of step time, not a duration)
TARGET_BATCH = 256
SPE = 16  # steps_per_execution suggested when the batch cannot grow
DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "uint16": 2, "int16": 2, "half": 2, "bfloat16": 2, "float": 4}
DTYPE_BYTES.update({"int32": 4, "uint32": 4, "double": 8, "int64": 8, "uint64": 8})


def _gain(step: float, removed: float) -> float:
    removed = min(max(removed, 0.0), 0.95 * step)  # never promise more than 20x from one fix
    return round(step / (step - removed), 2) if step > 0 else 1.0


def _ms(value: float) -> str:
    return f"{value:.1f} ms" if value >= 0.95 else f"{value:.2f} ms"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def _stage_name(stage: dict) -> str:
    ops = ", ".join(stage["ops"][:2])
    return f"{stage['kind']} ({ops})" if ops else stage["kind"]


def _element_bytes(stage: dict) -> int | None:
    """Bytes of one output element when its shapes are fully known, e.g. '[16,64,64,3] [16]' + 'uint8 int64'."""
    shapes = re.findall(r"\[([^\]]*)\]", str(stage["params"].get("shapes", "")))
    types = str(stage["params"].get("types", "")).split()
    if not shapes or len(shapes) != len(types):
        return None
    total = 0
    for dims, dtype in zip(shapes, types):
        size = DTYPE_BYTES.get(dtype)
        parts = [d for d in dims.split(",") if d.strip()]
        if size is None or any(not d.strip().isdigit() for d in parts):
            return None
        count = 1
        for d in parts:
            count *= int(d)
        total += count * size
    return total


def _fn_line(fn: dict | None, parallelism=None) -> str:
    if not fn:
        return "no function work recorded"
    top = ", ".join(f"{op} {_ms(ms)}" for op, ms in fn["top_ops"][:3] if ms > 0)
    ran = f"{fn['concurrency']:.1f} calls at a time" if fn.get("concurrency") else "calls at a time unknown"
    limit = f", parallelism {parallelism}" if parallelism else ""
    return (
        f"its function took {_ms(fn['work_ms'])} of CPU per step in {fn['calls_per_step']:.0f} calls on "
        f"{fn['threads']} thread(s), {ran}{limit}" + (f" (ops: {top})" if top else "")
    )


def _shares(fn: dict | None) -> dict:
    if not fn:
        return {}
    total = sum(fn["ops_ms"].values()) or fn["work_ms"] or 0.0
    return {k: v / total for k, v in fn["ops_ms"].items()} if total else {}


def _written_parallel(stage: dict) -> bool:
    return any(op.startswith("ParallelMap") for op in stage["user_ops"])


def _written_sequential_map(stage: dict) -> bool:
    return "MapDataset" in stage["user_ops"] and not _written_parallel(stage)


def _under(path: str, root: str) -> bool:
    return path.startswith(root + "::")


def _head(stage: dict, stages: list[dict]) -> dict:
    """The stage a cause is named after: a generator rather than its FlatMap, a reader's FlatMap/Interleave."""
    below = [o for o in stages if _under(o["path"], stage["path"])]
    if stage["kind"] == "FlatMap" and any(o["kind"] == "Generator" for o in below):
        return next(o for o in below if o["kind"] == "Generator")
    if stage["kind"] in iw.READERS:
        openers = [
            o
            for o in stages
            if _under(stage["path"], o["path"]) and (o["kind"] == "FlatMap" or "Interleave" in o["kind"])
        ]
        if openers:
            return max(openers, key=lambda o: o["path"].count("::"))
    return stage


def _units(stages: list[dict]) -> list[dict]:
    """Blocking time grouped by the stage that causes it, most first."""
    units: dict[str, dict] = {}
    for s in stages:
        if s["pass_through"] or s["blocking_ms"] <= 0:
            continue
        head = _head(s, stages)
        unit = units.setdefault(head["path"], {"head": head, "members": [], "blocking_ms": 0.0})
        unit["members"].append(s)
        unit["blocking_ms"] += s["blocking_ms"]
    return sorted(units.values(), key=lambda u: -u["blocking_ms"])


def input_causes(wait: dict, cpu_only: bool) -> list[dict]:
    """Recommendations for the input pipeline of one profile, unranked."""
    if not wait.get("measured"):
        return []
    step, input_ms = wait["step_ms"], wait["input_ms"] or 0.0
    other = max(step - input_ms, 0.0)  # the model's step and per-step overhead, what a prefetch could overlap
    cores = wait.get("cpu_budget") or 2
    cores_note = f"the {cores} cores tf.data was given in this profile"
    stages = wait["stages"]
    found: list[dict] = []

    def add(cause, title, removes, evidence, fix, caveat=None, kind="speed"):
        found.append(
            {
                "cause": cause,
                "title": title,
                "kind": kind,
                "score": round(100 * removes / step, 1) if step else 0.0,
                "removes_ms": round(removes, 3),
                "estimated_gain": _gain(step, removes),
                "evidence": evidence,
                "fix": fix,
                "caveat": caveat,
            }
        )

    waits = f"{_pct(input_ms, step)} of step time ({_ms(input_ms)} of {_ms(step)}) waits for input"
    for unit in _units(stages):
        _stage_cause(unit, stages, step, cores, cores_note, cpu_only, waits, add)
    for s in stages:
        if s["fill_ms"] > 0:
            _shuffle_fill(s, stages, step, cores, add)
    _cache_after_augmentation(stages, step, add)
    _no_prefetch(wait, stages, step, input_ms, other, cpu_only, add)
    _per_step_overhead(wait, step, add)
    return found


def _stage_cause(unit, stages, step, cores, cores_note, cpu_only, waits, add) -> None:
    head, blame = unit["head"], unit["blocking_ms"]
    fn = head["functions"]
    shares = _shares(fn)
    name = _stage_name(head)
    blames = f"{waits}; {_ms(blame)} of it ({_pct(blame, step)} of the step) on {name}"
    conc = (fn or {}).get("concurrency") or 1.0
    if head["kind"] == "Generator":
        removes = blame * max(1 - conc / cores, 0.0)
        add(
            "python-generator",
            "Python generator (from_generator) feeds the pipeline",
            removes,
            f"{blames}: Dataset.from_generator runs your Python one element at a time; " + _fn_line(fn),
            "Produce the examples with tf.data ops instead of Python, e.g. "
            "`tf.data.Dataset.from_tensor_slices(paths).map(load, num_parallel_calls=tf.data.AUTOTUNE)` with `load` "
            "built from tf.io.read_file, tf.io.decode_jpeg and tf.image.resize, or read TFRecord shards with "
            "`tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)`. Running more generators in "
            "parallel helps little: Python holds the GIL, so one of them runs Python at a time. "
            "In this template: pipeline.reader: tfrecord, pipeline.parallel_calls: auto.",
            f"Estimate: the same work spread over {cores_note}; TF ops are usually faster than the Python they "
            "replace, so the real gain can be larger. The trace shows time inside Python, not whether that Python "
            "computed or waited on files.",
        )
        return
    opener = head["kind"] == "FlatMap" or "Interleave" in head["kind"]
    readers = [
        o for o in stages if o["kind"] in iw.READERS and (o is head or (opener and _under(o["path"], head["path"])))
    ]
    if readers:
        reader = max(readers, key=lambda o: o["busy_ms"])
        files = reader["instances"]
        parallel = head["kind"] in iw.ASYNC or reader["threads"] > 1
        if not parallel:
            removes = blame * (1 - 1 / cores)
            add(
                "sequential-file-reads",
                "Files are read one after another",
                removes,
                f"{blames}: {reader['kind']} readers inside {head['kind']} opened {files} file(s) during the profile "
                f"and read them one after another on one thread ({_ms(reader['busy_ms'])} of reading per step)",
                "Read several files at once: `tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)`, or "
                "`tf.data.Dataset.from_tensor_slices(files).interleave(tf.data.TFRecordDataset, cycle_length=8, "
                "num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)`. "
                "In this template: pipeline.parallel_reads: auto.",
                f"Estimate: reading spread over {cores_note}. A host trace cannot tell waiting on storage from "
                "decompressing or parsing inside the reader (both are the reader's own time): on network storage "
                "parallel reads hide latency and can gain more; compressed files (GZIP/ZLIB) gain as far as cores "
                "allow.",
            )
        else:
            add(
                "slow-file-reads",
                "Reading files is slow even in parallel",
                blame,
                f"{blames}: {reader['kind']} readers under {head['kind']} read {files} file(s) on {reader['threads']} "
                "threads",
                "Read once and keep: `.cache()` after decoding (or `.cache(filename)` on local disk), fewer and larger "
                "shards (100-200 MB), uncompressed records on fast local disk. In this template: pipeline.cache: auto.",
                "Estimate: the reads vanish after the first epoch under a cache. The trace cannot tell storage latency "
                "from decompression on the CPU.",
            )
        return
    if head["kind"] not in iw.FUNCTION_STAGES or not fn:
        add(
            "slow-stage",
            f"The {head['kind']} stage holds the step",
            blame * 0.5,
            f"{blames}, work of its own (no function of yours ran in it)",
            "Measure that stage alone (iterate the dataset without the model) and move it before `.cache()` or after "
            "`.batch()` so it runs once per batch. In this template: `python -m train bench` compares pipelines.",
            "Estimate: half of its time, a guess: the trace shows where the time goes, not how much a change saves.",
        )
        return
    python = shares.get("python", 0.0)
    augmentation = shares.get("augmentation", 0.0)
    decode = shares.get("decode", 0.0)
    parallelism = head["params"].get("parallelism")
    ran = _fn_line(fn, parallelism)
    deterministic = augmentation == 0.0 and python == 0.0
    element = _element_bytes(head)
    cache_line = (
        "its ops are deterministic (no augmentation op ran), so `.cache()` right after it keeps its output and "
        "removes it from every epoch after the first"
        + (
            f" ({element / 1e6:.2f} MB per element in memory; `.cache(filename)` writes to disk instead)"
            if element
            else ""
        )
    )
    if python >= 0.5:
        removes = blame * max(1 - conc / cores, 0.0)
        add(
            "python-in-map",
            "Python inside a map (tf.py_function / tf.numpy_function)",
            removes,
            f"{blames}: {python:.0%} of its op time is Python (PyFunc ops: tf.py_function / tf.numpy_function); "
            + ran
            + ("; written without num_parallel_calls" if _written_sequential_map(head) else ""),
            "Rewrite the function with TensorFlow ops (tf.io.decode_jpeg, tf.image.*, tf.strings.*) and run it with "
            "`.map(f, num_parallel_calls=tf.data.AUTOTUNE)`. `num_parallel_calls` alone helps little while the "
            "function is Python: the GIL lets one call run Python at a time (only what releases the GIL, file reads, "
            "sleeps, large numpy operations, overlaps). If it must stay Python, run it once offline and store the "
            "result (TFRecord), or spread it over processes (tf.data service). In this template: pipeline.reader: "
            "tfrecord, pipeline.parallel_calls: auto, pipeline.data_service.",
            f"Estimate: the same work without the GIL, over {cores_note}; TF ops are usually faster than the Python "
            "they replace. The trace shows time inside Python, not whether it computed or waited on I/O.",
        )
        return
    if _written_sequential_map(head):
        parallel_gain = blame * max(1 - conc / cores, 0.0)
        options = [(parallel_gain, "`.map(f, num_parallel_calls=tf.data.AUTOTUNE)`")]
        if deterministic:
            options.append((blame, cache_line))
        best = max(options, key=lambda o: o[0])
        rescued = (
            f"tf.data parallelized it itself (map parallelization; parallelism {parallelism}), so on these cores "
            "`num_parallel_calls` adds little here but keeps it parallel where that optimization does not apply and "
            "lets autotune use every core of a larger host"
            if conc >= 1.3
            else "so one call runs at a time"
        )
        fix = (
            f"Write `.map(f, num_parallel_calls=tf.data.AUTOTUNE)` (removes about {_ms(parallel_gain)} per step here: "
            f"{_gain(step, parallel_gain):.2f}x)."
        )
        if deterministic:
            fix += f" Then: {cache_line} (up to {_ms(blame)} per step: {_gain(step, blame):.2f}x)."
        fix += " In this template: pipeline.parallel_calls: auto" + (
            ", pipeline.cache: auto." if deterministic else "."
        )
        add(
            "sequential-map",
            "A map written without num_parallel_calls",
            best[0],
            f"{blames}: a map written without num_parallel_calls (MapDataset), {rescued}; {ran}",
            fix,
            f"Estimate for parallel calls: the work spread over {cores_note}. On a CPU-only profile the map and the "
            "model share those cores, so whether the map is slow by itself or starved by the model cannot be told "
            "apart here.",
        )
        return
    if augmentation >= 0.4:
        add(
            "slow-augmentation",
            "Per-example augmentation is slower than the model",
            blame,
            f"{blames}: {augmentation:.0%} of its op time is augmentation, applied per example; {ran}",
            "Augment whole batches: `.batch(256).map(augment_batch, num_parallel_calls=tf.data.AUTOTUNE)` with ops "
            "that take a batch (one op call per batch instead of one per image), or move augmentation into the "
            "model as Keras layers (keras.layers.RandomFlip, RandomContrast, ...) so the accelerator runs it. "
            "In this template: pipeline.augment: batched (or device).",
            "Estimate: the augmentation leaves the input pipeline (into the model on an accelerator). "
            + (
                "On this CPU-only profile the model runs on the same cores, so moving it moves the work rather than "
                "removing it; batching it is what saves CPU here."
                if cpu_only
                else ""
            ),
        )
        return
    if decode >= 0.4:
        add(
            "decode-every-epoch",
            "Decoding every example every epoch",
            blame,
            f"{blames}: {decode:.0%} of its op time decodes; {ran}",
            "`.map(decode, num_parallel_calls=tf.data.AUTOTUNE).cache()` keeps decoded examples after the first "
            "epoch; if they do not fit in memory, decode at reduced size (`tf.io.decode_jpeg(data, ratio=2)`, "
            "`tf.io.decode_and_crop_jpeg`) or `.cache(filename)`. In this template: pipeline.cache: auto, "
            "pipeline.scaled_decode, pipeline.random_crop.",
            "Estimate: decoding vanishes after the first epoch under a cache.",
        )
        return
    removes = blame if deterministic else blame * max(1 - conc / cores, 0.0)
    more_cores = (
        "`.map(f, num_parallel_calls=tf.data.AUTOTUNE)` on a host with more cores, or tf.data service workers "
        "(`ds.apply(tf.data.experimental.service.distribute(...))`)"
    )
    add(
        "heavy-map",
        "A map does more work than the model",
        removes,
        f"{blames}: {ran}",
        (
            f"{cache_line[0].upper()}{cache_line[1:]}. Otherwise give the pipeline more cores: {more_cores}. "
            "In this template: pipeline.cache: auto, pipeline.data_service."
            if deterministic
            else f"Give the pipeline more cores: {more_cores}; or move the work into the model (on the accelerator) "
            "or offline. In this template: pipeline.data_service."
        ),
        "Estimate: "
        + (
            "the map vanishes after the first epoch under a cache." if deterministic else f"the work over {cores_note}."
        ),
    )


def _shuffle_fill(s, stages, step, cores, add) -> None:
    below = [o for o in stages if _under(o["path"], s["path"]) and o["functions"]]
    work = ", ".join(
        f"{o['kind']} ({', '.join(f'{op} {_ms(ms)}' for op, ms in o['functions']['top_ops'][:2])})" for o in below[:2]
    )
    # Shuffling earlier removes the burst, not the work: each element is still decoded once per epoch, now in
    # the steady state, spread over the cores.
    redone = sum(o["functions"]["work_ms"] for o in below) / cores
    removes = max(s["fill_ms"] - redone, 0.0)
    size = ""
    if s["element_mb"]:
        buffer = s["params"].get("buffer_size")
        total = f", about {s['element_mb'] * float(buffer):.0f} MB in all" if str(buffer).isdigit() else ""
        size = f"; each buffered element takes {s['element_mb']:.2f} MB{total}"
    add(
        "shuffle-buffer-refill",
        "A shuffle buffer of expensive elements is refilled",
        removes,
        f"{_ms(s['fill_ms'])} per step ({_pct(s['fill_ms'], step)} of step time) waits while {_stage_name(s)} fills "
        f"its buffer of {s['params'].get('buffer_size', '?')} elements: {s['fills']} fill(s) in the profile (each new "
        f"iterator, e.g. every epoch), {s['pulled_per_fill']:.0f} elements pulled one by one"
        + (f" through {work}" if work else "")
        + size,
        "Shuffle before the expensive work, so the buffer holds file names or encoded records: "
        "`tf.data.Dataset.from_tensor_slices(paths).shuffle(len(paths))"
        ".map(load, num_parallel_calls=tf.data.AUTOTUNE)`; or resize before the shuffle so the buffer holds "
        "small images. In this template: pipeline.shuffle_before_decode: true."
        + (
            f" The work itself stays ({_ms(redone * cores)} of CPU per step): `.cache()` after decoding and resizing "
            "removes it from later epochs."
            if redone
            else ""
        ),
        f"Estimate: the fills vanish and their work ({_ms(redone * cores)} of CPU per step) is done in the steady "
        f"state instead, over {cores} cores. Shuffling file names shuffles less finely within a file (not at all "
        "for one image per file).",
    )


def _cache_after_augmentation(stages, step, add) -> None:
    for cache in (s for s in stages if "Cache" in s["kind"] or s["kind"].startswith("Snapshot")):
        for s in stages:
            fn = s["functions"]
            if not _under(s["path"], cache["path"]) or not fn or not fn["ops_ms"].get("augmentation"):
                continue
            ops = [op for op, _ in fn["top_ops"] if iw.op_category(op) == "augmentation"]
            add(
                "cache-after-augmentation",
                "cache() stores augmented examples",
                0.0,
                f"{_stage_name(cache)} caches the output of {_stage_name(s)}, whose function ran augmentation ops "
                f"({', '.join(ops) or 'augmentation'}: {_ms(fn['ops_ms']['augmentation'])} per step) and was being "
                f"cached in this profile ({_pct(s['blocking_ms'], step)} of step time waits on it): if those ops are "
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
                kind="correctness",
            )
            return


def _no_prefetch(wait, stages, step, input_ms, other, cpu_only, add) -> None:
    if wait["prefetch"] or input_ms <= 0:
        return
    top = next((s for s in stages if s["path"].count("::") >= 1 and not s["pass_through"]), None)
    if top is None or top["async"]:
        return  # the stage the model reads from already runs ahead of it
    removes = min(input_ms, other)
    autotune = " (autotune is off, so tf.data injected none)" if wait.get("autotune") is False else ""
    add(
        "no-prefetch",
        "Nothing runs ahead of the model (no prefetch)",
        removes,
        f"no Prefetch anywhere in the pipeline{autotune}: the stage the model reads from, {_stage_name(top)}, is "
        f"synchronous, so every batch is produced while the model waits: {_ms(input_ms)} per step, against "
        f"{_ms(other)} of step that could overlap it",
        "End the pipeline with `.prefetch(tf.data.AUTOTUNE)`. In this template: pipeline.prefetch: auto.",
        "Estimate: production overlaps the rest of the step (it can hide at most that much)."
        + (
            " On a CPU-only profile the pipeline and the model then share the cores, so the overlap is partial."
            if cpu_only
            else ""
        ),
    )


def _per_step_overhead(wait, step, add) -> None:
    overhead, batch = wait["overhead_ms"], wait.get("batch_size")
    if overhead <= 0:
        return
    figures = (
        f"a step takes {_ms(step)}; {_ms(overhead)} of it ({_pct(overhead, step)}) is neither waiting for input nor "
        "running the model's ops (Python, Keras callbacks, dispatching the step)"
    )
    if batch and batch < TARGET_BATCH:
        add(
            "small-batch",
            f"Batches of {batch} make per-step overhead dominate" if overhead > step / 2 else f"Batch of {batch}",
            overhead * (1 - batch / TARGET_BATCH),
            f"{figures}: a cost paid every {batch} examples",
            f"`.batch({TARGET_BATCH})` (scale the learning rate with the batch); where memory does not allow it, run "
            f"several steps per call: `model.compile(..., steps_per_execution={SPE})`. In this template: "
            "pipeline.batch_size (`make sweep-batch` finds the largest that fits), train.steps_per_execution.",
            f"Estimate: per example, with the per-step overhead paid once per {TARGET_BATCH} examples and everything "
            "else growing with the batch; larger batches also use the device better, which this does not count.",
        )
    else:
        add(
            "per-step-overhead",
            "Per-step overhead",
            overhead * (1 - 1 / SPE),
            figures,
            f"Run several steps per call: `model.compile(..., steps_per_execution={SPE})`. In this template: "
            "train.steps_per_execution.",
            f"Estimate: the per-step overhead paid once per {SPE} steps.",
        )
