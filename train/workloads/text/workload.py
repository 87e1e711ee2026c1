"""The text workload behind the one interface (train/workloads/base.py): datasets built by build.py, the
pipeline of pipeline.py (batched by length), the models of model.py, and real (non-padding) tokens/s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from train.workloads.base import Presets, Unit, Workload
from train.workloads.text import report


class TextWorkload(Workload):
    name = "text"
    presets = Presets(
        folder="configs/text",
        cpu_scenario="configs/text/cpu.yaml",
        cpu_model="a small Transformer encoder",
        ladder="configs/ladder/text.yaml",
    )
    # a text batch holds 32 to hundreds of texts, padded little or much: the work done is the real tokens
    unit = Unit("real tokens/s", "tokens/s", "real_tokens_per_s", "real_tokens_per_sec", "1,000 real tokens")
    pipeline_key = "text.pipeline"
    batch_knob = "text.pipeline.batch_size"
    data_key = "text.data"
    batch_label = "batch size (texts of the longest length)"
    max_sweep_batch = 256  # texts of the longest length (131,072 slots of 512 tokens)
    report_rows = report.ROWS

    def prepare_data(self, cfg, log=print):
        from train.workloads.text import build

        return build.prepare(cfg.text.data, log)

    def locate(self, cfg, build_hint: str = "make data TASK=text"):
        from train.workloads.text import build

        return build.locate(cfg.text.data, build_hint)

    def describe_data(self, spec, built: bool) -> str:
        verb = "Built" if built else "Already built (nothing to do)"
        lengths = spec.length_statistics()
        return (
            f"{verb}: {spec.name} at {spec.root}: {spec.num_train} train + {spec.num_val} validation texts, "
            f"{len(spec.train_files)}+{len(spec.val_files)} token shards, vocabulary {spec.vocab_size}, "
            f"{spec.num_classes} classes, tokens per text median {lengths['median']:.0f}, p99 {lengths['p99']:.0f}, "
            f"max {lengths['max']}" + (f"; {spec.skipped} bad row(s) skipped" if spec.skipped else "") + "."
        )

    def dataset_facts(self, spec) -> dict:
        return {
            **super().dataset_facts(spec),
            "source": spec.source,
            "vocab_size": spec.vocab_size,
            "max_length": spec.max_length,
            "length_statistics": spec.length_statistics(),
            "truncated": spec.truncated,
            "skipped_rows": spec.skipped,
        }

    def shape_facts(self, spec) -> dict:
        return {"text": spec.length_statistics()}

    def dataset_line(self, spec) -> str:
        return f"{spec.name} ({spec.num_train} training texts of at most {spec.max_length} tokens, {spec.root})"

    def resolve(self, cfg, spec, found):
        """The bucket lengths from the built dataset's length histogram, the pack length from its longest text."""
        from train.workloads.text import pipeline

        knobs, reasons = pipeline.resolve(cfg.text.pipeline, spec)
        cfg = cfg.with_section("text", dataclasses.replace(cfg.text, pipeline=knobs))
        cfg, _ = super().resolve(cfg, spec, found)
        return cfg, reasons

    def batching(self, cfg, spec, replicas: int) -> tuple[int, int]:
        """Rows per batch for pad_max and pad_batch; bucket and pack batches are sized by text.pipeline.token_budget."""
        from train.workloads.text import pipeline

        global_batch = cfg.text.pipeline.batch_size * replicas
        knobs = dataclasses.replace(cfg.text.pipeline, batch_size=global_batch)
        return global_batch, pipeline.steps_per_epoch(knobs, spec)

    def batch_override(self, cfg, spec, batch: int) -> str:
        """A batch of `batch` texts of the longest length."""
        if cfg.text.pipeline.batching in ("bucket", "pack"):
            return f"text.pipeline.token_budget={batch * spec.max_length}"
        return f"text.pipeline.batch_size={batch}"

    def build_dataset(self, cfg, spec, *, split, training, batch_size, seed, files=None, damaged=None):
        """Reader python reads the split's raw shards, tfrecord its token shards."""
        from train.workloads.text import pipeline

        knobs = cfg.text.pipeline
        if files is None:
            files = pipeline.input_files(spec, knobs, split == "train")
        return pipeline.build(files, spec, knobs, training=training, batch_size=batch_size, seed=seed)

    def describe_pipeline(self, cfg, spec, batch_size: int) -> str:
        from train.workloads.text import pipeline

        return pipeline.describe(cfg.text.pipeline, spec, batch_size)

    def caches(self, cfg) -> bool:
        return cfg.text.pipeline.cache and cfg.text.pipeline.reader == "tfrecord"

    def ceiling(self, dataset, epoch_steps: int, batch_size: int):
        """One epoch of batches from memory: every bucket's shape, at zero input cost."""
        cached = dataset.take(epoch_steps).cache().repeat().prefetch(2)
        return cached, f"one epoch of {epoch_steps} batches cached and repeated (zero input cost)"

    def model_input(self, cfg, spec):
        from train.workloads.text.model import TokenInput

        knobs = cfg.text.pipeline
        return TokenInput(spec.vocab_size, spec.max_length, knobs.batching == "pack", knobs.max_segments)

    def metrics(self, cfg) -> dict:
        """Packed rows carry a weight per segment slot: 0 where a row holds fewer texts than max_segments."""
        from train import models

        packed = cfg.text.pipeline.batching == "pack"
        return {"weighted_metrics" if packed else "metrics": models.metrics()}

    def export(self, cfg, spec, model, run_dir: Path) -> None:
        """serving.keras: the trained model behind the dataset's TextVectorization, raw strings in, logits out. A
        model trained on packed rows is rebuilt for unpacked ones first (the same layers and weights)."""
        from train import models
        from train.core import files
        from train.workloads.text import model as text_model
        from train.workloads.text.vocabulary import load_vocabulary

        if isinstance(model.input, dict):
            shape = text_model.TokenInput(spec.vocab_size, spec.max_length)
            unpacked = models.build_model(cfg.model.name, shape, spec.num_classes, cfg.model.params)
            unpacked.set_weights(model.get_weights())
            model = unpacked
        serving = text_model.serving_model(model, load_vocabulary(spec.vocabulary_path), spec.max_length)
        files.atomic_write(run_dir / "serving.keras", serving.save)

    def counter(self):
        from train.workloads.text.meter import TokenCounter

        return TokenCounter()

    def meter(self, warmup_steps: int, logdir: Path, jit_compile: bool, run_dir: Path, chief: bool, profiler=None):
        from train.workloads.text.meter import TextMeter

        return TextMeter(warmup_steps, logdir, jit_compile, run_dir, chief, profiler)

    def describe_figures(self, figures: dict | None) -> str:
        figures = figures or {}
        if not figures.get("real_tokens_per_s") or figures.get("padding_share") is None:
            return ""
        shapes = figures["distinct_shapes"]
        return (
            f"{figures['real_tokens_per_s']:,.0f} real tokens/s, {figures['padding_share']:.0%} padding, "
            f"{shapes} shape{'' if shapes == 1 else 's'}, "
        )

    def pipeline_cost(self, cfg, spec, global_batch: int, epoch_steps: int, seconds: float) -> dict:
        """The text pipeline alone: CPU time per real token (padding left out) and memory."""
        import numpy as np

        from train.measure.alone import pull
        from train.workloads.text import figures

        (tokens, texts), cpu, elapsed, growth = pull(
            lambda: iter(
                self.build_dataset(
                    cfg, spec, split="train", training=True, batch_size=global_batch, seed=cfg.train.seed
                )
            ),
            epoch_steps + 2 if cfg.text.pipeline.cache else 2,
            seconds,
            lambda batch: (int(np.count_nonzero(figures.token_ids_of(batch))), figures.examples_of(batch)),
        )
        return {
            "core_seconds_per_token": cpu / tokens,
            "real_tokens_per_sec_alone": tokens / elapsed,
            "texts_per_sec_alone": texts / elapsed,
            "memory_growth_mb": growth,
        }

    def cost_figures(self, cost: dict, floor: dict | None, ceiling_rate: float) -> dict:
        return {
            "cores_per_100k_tokens": cost["core_seconds_per_token"] * 1e5,
            "cores_to_feed_device": cost["core_seconds_per_token"] * ceiling_rate,
        }

    def cost_lines(self, result: dict) -> list[str]:
        return report.cost_lines(result)

    def tune_space(self, cfg, spec, found, *, replicas: int = 1, batch: bool = False):
        from train.workloads.text import tuning

        return tuning.space(cfg, spec, found, replicas=replicas, batch=batch)

    def report_row(self, summary: dict) -> dict:
        return report.row(summary, (summary.get("choices") or {}).get("steps_per_execution"))

    def report_lines(self, report_: dict) -> list[str]:
        return report.shapes_lines(report_)

    def bar_label(self, value: float, row: dict) -> str:
        return report.bar_label(value, row)

    def hparams(self, config: dict) -> dict:
        p = config["text"]["pipeline"]
        return {
            "reader": p["reader"],
            "parallel_calls": str(p["parallel_calls"]),
            "cache": str(p["cache"]),
            "prefetch": str(p["prefetch"]),
            "batching": p["batching"],
            **super().hparams(config),
            "token_budget": p["token_budget"],
        }


WORKLOAD = TextWorkload()
