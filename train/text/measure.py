"""The text task's measurements (docs/text.md): the naive and the optimized text pipelines alone and with the
small model, in short interleaved rounds; padding, shapes, XLA compiles; accuracy after a few epochs.

    python -m train.text.measure --phases input,e2e,figures,compiles,accuracy --out text-measure.json

- input: batches/s of each pipeline alone, as real tokens/s;
- e2e: the model's compiled train step on each pipeline, as real tokens/s (counted on the batches the step
  consumed); variants `ceiling` (the optimized batches from memory: the model alone) and `optimized_bf16`
  (the optimized pipeline under mixed_bfloat16: the plan's `auto` on a CPU with bf16 units);
- figures: padding share, distinct shapes, texts per step over one epoch of each pipeline;
- compiles: XLA compiles of a jit-compiled train step over one epoch, counted from an XLA dump in a child
  process (XLA_FLAGS is read when TensorFlow starts);
- accuracy: Keras fit of each preset for a few epochs, validation accuracy and wall time.

Rounds are interleaved (the order rotates each round), each trial preceded by an untimed pre-roll; the naive
variant is measured twice per round (A/A) to give the noise. Gains are medians of per-round ratios
(train/benchmarks/stats.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import keras
import tensorflow as tf

from step_doctor.machine import cpu_bf16, cpu_model
from train import config, models
from train.benchmarks import stats
from train.core import files
from train.text import build, figures, pipeline, settings
from train.text.model import TokenInput

ROOT = files.PROJECT_ROOT
PREROLL_S = 0.3


def presets(overrides: list[str]) -> dict[str, settings.TextConfig]:
    return {name: config.load(ROOT / f"configs/text/{name}.yaml", overrides).text for name in ("naive", "optimized")}


def make_model(spec, knobs, policy: str = "float32", jit: bool = False, total_steps: int | None = None):
    keras.mixed_precision.set_global_policy(policy)
    shape = TokenInput(spec.vocab_size, spec.max_length, knobs.batching == "pack", knobs.max_segments)
    model = models.build_model("text_small", shape, spec.num_classes, {})
    rate = 0.002 if not total_steps else keras.optimizers.schedules.CosineDecay(0.002, total_steps, alpha=0.01)
    weighted = knobs.batching == "pack"
    model.compile(
        optimizer=models.optimizer(rate),
        loss=models.loss(),
        metrics=None if weighted else models.metrics(),
        weighted_metrics=models.metrics() if weighted else None,
        jit_compile=jit,
    )
    keras.mixed_precision.set_global_policy("float32")
    return model


def counted(dataset: tf.data.Dataset, counter: tf.Variable) -> tf.data.Dataset:
    """`dataset` with the real tokens and texts of each batch added to `counter` as the consumer takes it
    (a map after the prefetch runs in the consumer's GetNext)."""

    def count(*batch):
        ids = figures.token_ids_of(batch)
        texts = tf.reduce_sum(batch[2]) if len(batch) == 3 else tf.cast(tf.shape(batch[1])[0], tf.float32)
        update = counter.assign_add(
            tf.stack([tf.cast(tf.math.count_nonzero(ids), tf.float64), tf.cast(texts, tf.float64)])
        )
        with tf.control_dependencies([update]):
            return tf.nest.map_structure(tf.identity, batch)

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # no buffer between the count and the consumer
    return dataset.map(count).with_options(options)


@dataclasses.dataclass
class Variant:
    name: str
    step: object  # () -> None: one batch (input) or one train step (e2e)
    counter: tf.Variable
    sync: object = None  # () -> None: wait for the device
    samples: list = dataclasses.field(default_factory=list)  # real tokens/s
    texts: list = dataclasses.field(default_factory=list)  # texts/s

    def trial(self, seconds: float) -> None:
        started = time.perf_counter()
        while time.perf_counter() - started < PREROLL_S:
            self.step()
        if self.sync:
            self.sync()
        before = self.counter.numpy().copy()
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.step()
        if self.sync:
            self.sync()
        elapsed = time.perf_counter() - started
        tokens, texts = self.counter.numpy() - before
        self.samples.append(tokens / elapsed)
        self.texts.append(texts / elapsed)


def dataset_for(spec, knobs, seed: int = 0):
    resolved, _ = pipeline.resolve(knobs, spec)
    return resolved, pipeline.build(
        pipeline.input_files(spec, resolved, True), spec, resolved, training=True, seed=seed
    )


# name -> (preset, knob changes, precision policy): the ladder from naive to optimized, and side variants
VARIANTS = {
    "naive": ("naive", {}, "float32"),
    "naive_aa": ("naive", {}, "float32"),  # naive again, for the A/A noise
    "tokens_once": ("naive", {"reader": "tfrecord"}, "float32"),  # no Python per text; still serial, padded to 512
    "parallel": ("optimized", {"batching": "pad_max", "batch_size": 32}, "float32"),  # + interleave, cache, prefetch
    "optimized": ("optimized", {}, "float32"),  # + length buckets under a token budget
    "budget_8k": ("optimized", {"token_budget": 8192}, "float32"),
    "pad_batch": ("optimized", {"batching": "pad_batch", "batch_size": 32}, "float32"),
    "pack": ("optimized", {"batching": "pack"}, "float32"),
    "optimized_bf16": ("optimized", {}, "mixed_bfloat16"),  # precision auto on a CPU with bf16 units
    "naive_bf16": ("naive", {}, "mixed_bfloat16"),
    "ceiling": ("optimized", {}, "float32"),  # the optimized batches from memory: the model alone
}


def variant_dataset(spec, texts: dict, name: str, seed: int):
    preset, changes, policy = VARIANTS[name]
    knobs, dataset = dataset_for(spec, dataclasses.replace(texts[preset].pipeline, **changes), seed=seed)
    if name == "ceiling":
        dataset = dataset.take(400).cache().repeat()
    return knobs, dataset, policy


def input_variants(spec, texts: dict, names: list[str]) -> list[Variant]:
    variants = []
    for name in names:
        _, dataset, _ = variant_dataset(spec, texts, name, seed=len(variants))
        counter = tf.Variable([0.0, 0.0], trainable=False, dtype=tf.float64)
        iterator = iter(counted(dataset, counter))
        variants.append(Variant(name, lambda it=iterator: next(it), counter))
    return variants


def e2e_variants(spec, texts: dict, names: list[str]) -> list[Variant]:
    variants = []
    for name in names:
        knobs, dataset, policy = variant_dataset(spec, texts, name, seed=len(variants))
        counter = tf.Variable([0.0, 0.0], trainable=False, dtype=tf.float64)
        model = make_model(spec, knobs, policy=policy)
        model.make_train_function()
        iterator = iter(counted(dataset, counter))
        last = {}

        def step(model=model, iterator=iterator, last=last):
            last["logs"] = model.train_function(iterator)

        def sync(last=last):
            if last:
                float(next(iter(last["logs"].values())))

        variants.append(Variant(name, step, counter, sync))
    return variants


def interleave(variants: list[Variant], rounds: int, seconds: float, log) -> None:
    for variant in variants:  # warm-up: tracing, autotuning, filling caches (not measured)
        started = time.perf_counter()
        while time.perf_counter() - started < max(3.0, seconds):
            variant.step()
    for index in range(rounds):
        order = variants[index % len(variants) :] + variants[: index % len(variants)]
        for variant in order:
            variant.trial(seconds)
        log(f"round {index + 1}: " + ", ".join(f"{v.name} {v.samples[-1]:,.0f}" for v in variants) + f" ({load()})")


def summary(variants: list[Variant]) -> dict:
    by_name = {v.name: v for v in variants}
    naive = by_name["naive"]
    aa = stats.paired(by_name["naive_aa"].samples, naive.samples) if "naive_aa" in by_name else []
    result = {"noise": stats.noise(aa), "aa_ratios": aa, "variants": {}}
    for variant in variants:
        verdict = stats.judge(stats.paired(variant.samples, naive.samples), aa)
        result["variants"][variant.name] = {
            "real_tokens_per_s": stats.summarize(variant.samples),
            "texts_per_s": stats.summarize(variant.texts),
            "gain_over_naive": verdict.as_dict(),
        }
    return result


def epoch_figures(spec, texts: dict) -> dict:
    found = {}
    for name, text in texts.items():
        knobs, dataset = dataset_for(spec, text.pipeline)
        steps = pipeline.steps_per_epoch(knobs, spec)
        seen = figures.of_batches(dataset.take(steps))
        found[name] = {
            **seen.as_dict(),
            "steps_per_epoch": steps,
            "texts_per_step": seen.examples / seen.batches,
            "pipeline": pipeline.describe(knobs, spec),
        }
    return found


def compiles(data: settings.TextDataConfig, overrides: list[str], log) -> dict:
    """XLA compiles of a jit-compiled train step over one epoch of each preset, in child processes."""
    found = {}
    for name in ("naive", "optimized"):
        with tempfile.TemporaryDirectory() as dump:
            env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}", "TF_CPP_MIN_LOG_LEVEL": "2"}
            command = [
                sys.executable,
                "-m",
                "train.text.measure",
                "--child-compiles",
                name,
                "--data-dir",
                data.data_dir,
            ]
            command += [arg for item in overrides for arg in ("--set", item)]
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            if result.returncode:
                raise RuntimeError(result.stderr[-3000:])
            child = json.loads(result.stdout.strip().splitlines()[-1])
            names = {p.name.split(".", 1)[0]: p.name for p in Path(dump).glob("module_*.txt")}
            child["xla_compiles"] = len(names)
            child["xla_compiles_train_step"] = sum("one_step_on_data" in n for n in names.values())
        log(f"compiles {name}: {child}")
        found[name] = child
    return found


def child_compiles(name: str, data: settings.TextDataConfig, overrides: list[str]) -> None:
    spec, _ = build.prepare(data, log=lambda line: None)
    knobs, dataset = dataset_for(spec, presets(overrides)[name].pipeline)
    steps = pipeline.steps_per_epoch(knobs, spec) if name == "optimized" else 12
    model = make_model(spec, knobs, jit=True)
    started = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    seconds = time.perf_counter() - started
    shapes = figures.of_batches(dataset.take(steps))
    print(json.dumps({"steps": steps, "seconds": seconds, "distinct_shapes": shapes.distinct_shapes}))


def accuracy(spec, texts: dict, epochs: int, log) -> dict:
    found = {}
    for name, text in texts.items():
        knobs, train = dataset_for(spec, text.pipeline)
        val = pipeline.build(pipeline.input_files(spec, knobs, False), spec, knobs, training=False)
        steps = pipeline.steps_per_epoch(knobs, spec)
        model = make_model(spec, knobs, total_steps=steps * epochs)
        started = time.perf_counter()
        history = model.fit(train, steps_per_epoch=steps, epochs=epochs, validation_data=val, verbose=0).history
        found[name] = {
            "epochs": epochs,
            "steps_per_epoch": steps,
            "wall_s": time.perf_counter() - started,
            "val_accuracy": history["val_accuracy"],
            "accuracy": history["accuracy"],
        }
        log(f"accuracy {name}: {found[name]}")
    return found


PROFILED = {  # name -> (variant, XLA)
    "naive": ("naive", False),
    "optimized": ("optimized", False),
    "churn": ("pad_batch", True),  # padded to the longest of each batch, jit-compiled: a compile per new shape
}


def profiles(spec, texts: dict, logdir: Path, log) -> dict:
    """A StepTraceProfiler capture of 10 steady steps of each PROFILED run, and the doctor's verdict on it."""
    from step_doctor.callbacks import StepTraceProfiler

    found = {}
    for name, (variant, jit) in PROFILED.items():
        knobs, train, policy = variant_dataset(spec, texts, variant, seed=0)
        model = make_model(spec, knobs, policy=policy, jit=jit)
        run_dir = logdir / f"text_{name}"
        model.fit(train, steps_per_epoch=24, epochs=1, verbose=0, callbacks=[StepTraceProfiler(run_dir, 8, 10)])
        result = subprocess.run(
            [sys.executable, "-m", "step_doctor", "diagnose", str(run_dir)], capture_output=True, text=True, timeout=600
        )
        found[name] = {"logdir": str(run_dir), "diagnose": result.stdout, "status": result.returncode}
        log(f"diagnose {name}:\n{result.stdout}")
    return found


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cpu_bf16": cpu_bf16(),
        "cores": len(os.sched_getaffinity(0)),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phases", default="input,e2e,figures,compiles,accuracy,profile")
    parser.add_argument("--data-dir", default="shards")
    parser.add_argument("--set", action="append", default=[], help="text.KEY=VALUE overrides of both presets")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--input", default="naive,naive_aa,tokens_once,parallel,optimized,pack")
    parser.add_argument("--e2e", default="naive,naive_aa,optimized,ceiling,optimized_bf16")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--logdir", type=Path, default=Path("runs/text-profiles"))
    parser.add_argument("--child-compiles", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    overrides = [f"text.data.data_dir={args.data_dir}", *args.set]
    texts = presets(overrides)
    if args.child_compiles:
        return child_compiles(args.child_compiles, texts["naive"].data, overrides)
    spec, _ = build.prepare(texts["naive"].data)
    log = lambda line: print(line, flush=True)  # noqa: E731
    results = {"machine": machine(), "load_before": load(), "spec": spec.length_statistics(), "phases": {}}
    started = time.perf_counter()
    phases = args.phases.split(",")
    if "input" in phases:
        variants = input_variants(spec, texts, args.input.split(","))
        interleave(variants, args.rounds, args.seconds, log)
        results["phases"]["input"] = summary(variants)
    if "e2e" in phases:
        variants = e2e_variants(spec, texts, args.e2e.split(","))
        interleave(variants, args.rounds, args.seconds, log)
        results["phases"]["e2e"] = summary(variants)
    if "figures" in phases:
        results["phases"]["figures"] = epoch_figures(spec, texts)
    if "compiles" in phases:
        results["phases"]["compiles"] = compiles(texts["naive"].data, overrides, log)
    if "profile" in phases:
        results["phases"]["profile"] = profiles(spec, texts, args.logdir, log)
    if "accuracy" in phases:
        results["phases"]["accuracy"] = accuracy(spec, texts, args.epochs, log)
    results["load_after"] = load()
    results["wall_s"] = time.perf_counter() - started
    text = json.dumps(results, indent=2, default=float)
    if args.out:
        files.write_text(args.out, text + "\n")
    print(text)


if __name__ == "__main__":
    main()
