"""The one interface of a workload (TF Model Garden's `Task`): what training and the benchmarks ask of it.

A workload says how its dataset is built and found, how its pipeline is built from its knobs, which
model it trains with which metrics, what figures its runs report and which knobs `make tune` may
search. Training, the CLI and every benchmark call these methods and never ask which workload runs.
Subclass `Workload`, set the attributes, implement the four abstract methods (`prepare_data`,
`locate`, `build_dataset`, `model_input`); every other method has a default that fits a workload
whose pipeline knobs are a `train.input.knobs.ReadKnobs` at `pipeline_key`.

A dataset spec is the workload's own (a frozen dataclass, e.g. shards/spec.py's DatasetSpec,
text/spec.py's TextSpec); the defaults read what `Spec` names of it. A config's sections are attributes of the config
(`cfg.pipeline`, `cfg.text`), typed by the workload's settings.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

from train.core.errors import UserError
from train.core.tuning import Knob, train_knobs


class Spec(Protocol):
    """What every built dataset says of itself (the rest is the workload's own)."""

    name: str
    root: Path
    num_train: int
    num_val: int

    @property
    def num_classes(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class Presets:
    folder: str  # configs/ or configs/<name>/: base.yaml, naive.yaml, optimized.yaml (and tuned.yaml, by tune)
    cpu_scenario: str  # the overlay `--scenario auto` applies where no GPU is found
    cpu_model: str = "a tiny model"  # what that overlay trains, for the logs
    ladder: str | None = None  # its own ladder (configs/ladder/...); None: the scenario's

    def path(self, name: str) -> str:
        return f"{self.folder}/{name}.yaml"

    @property
    def base(self) -> str:
        return self.path("base")

    @property
    def naive(self) -> str:
        return self.path("naive")

    @property
    def optimized(self) -> str:
        return self.path("optimized")

    @property
    def tuned(self) -> Path:
        return Path(self.path("tuned"))


@dataclasses.dataclass(frozen=True)
class Unit:
    """What a rate counts, in every report."""

    label: str = "examples/s"
    short: str = "ex/s"  # in tables
    key: str = "examples_per_sec"  # compare: the run's figure its speedup is taken of
    tag: str = "examples_per_sec"  # TensorBoard tags: bench/<tag>, tune/best_<tag>
    per_step: str = "example"  # compare's step-time chart: microseconds per this


@dataclasses.dataclass(frozen=True)
class Features:
    """The measurements and loops a workload supports beyond the ones every workload has."""

    data_service: bool = False  # bench's tf.data service variants
    decode_floor: bool = False  # bench's decode floor (decoding alone, one thread)
    multi_worker: bool = False  # train.strategy: multi_worker (the custom loop)


def get(obj, dotted: str):
    """The value of a dotted key (pipeline.cache) in a config."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def with_value(obj, dotted: str, value):
    """A copy of a config (or one of its sections) with the dotted key set."""
    head, _, rest = dotted.partition(".")
    new = with_value(getattr(obj, head), rest, value) if rest else value
    if head in getattr(obj, "sections", {}):
        return obj.with_section(head, new)
    return dataclasses.replace(obj, **{head: new})


class Workload:
    name: str = ""
    presets: Presets
    unit: Unit = Unit()
    features: Features = Features()
    pipeline_key = "pipeline"  # where its pipeline knobs are (a ReadKnobs)
    batch_knob = "pipeline.batch_size"  # the per-replica batch size
    data_key = "data"  # the section that says which dataset is built (make data builds it)
    batch_label = "batch size"  # sweep-batch's axis
    max_sweep_batch: int | None = None  # sweep-batch's default --max (None: the command's)
    report_rows: tuple = ()  # compare: (label, key, decimals, suffix) shown before the shared rows

    @property
    def make_args(self) -> str:
        """What `make` needs to run this workload's presets."""
        from train.workloads import DEFAULT

        return "" if self.name == DEFAULT else f" TASK={self.name}"

    # The dataset
    def prepare_data(self, cfg, log=print) -> tuple[object, bool]:
        """Build the dataset `cfg` trains on unless it is built: (its spec, built now)."""
        raise NotImplementedError

    def locate(self, cfg, build_hint: str = "make data"):
        """The built dataset's spec, or a UserError naming `build_hint`, the command that builds it."""
        raise NotImplementedError

    def describe_data(self, spec, built: bool) -> str:
        verb = "Built" if built else "Already built (nothing to do)"
        return (
            f"{verb}: {spec.name} at {spec.root}: {spec.num_train} train + {spec.num_val} validation examples, "
            f"{spec.num_classes} classes."
        )

    def dataset_facts(self, spec) -> dict:
        """summary.json's `dataset`."""
        return {
            "name": spec.name,
            "root": str(spec.root),
            "num_train": spec.num_train,
            "num_val": spec.num_val,
            "num_classes": spec.num_classes,
        }

    def shape_facts(self, spec) -> dict:
        """What the benchmarks' JSON records of the examples' shape."""
        return {}

    def dataset_line(self, spec) -> str:
        """One line for tune's overlay header."""
        return f"{spec.name} ({spec.num_train} training examples, {spec.root})"

    def check_data(self, cfg, spec, build_hint: str) -> tuple[dict, list]:
        """Before the first step: raise on a damaged dataset, or (readable records of damaged shards, what is
        skipped) where the config skips damaged records."""
        return {}, []

    def skips_corrupt(self, cfg) -> bool:
        return False

    def data_error(self, error: Exception, spec, build_hint: str) -> Exception:
        """A clearer error when the data is what failed a run; else `error`."""
        return error

    # The plan
    def resolve(self, cfg, spec, found) -> tuple[object, dict]:
        """`cfg` with the workload's data- and device-dependent `auto`s decided, and the reason for each."""
        if cfg.train.deterministic and not get(cfg, self.pipeline_key).deterministic:
            cfg = with_value(cfg, f"{self.pipeline_key}.deterministic", True)
        return cfg, {}

    def data_service(self, cfg) -> str | None:
        return None

    def with_data_service(self, cfg, target: str):
        raise UserError(f"The {self.name} workload's pipeline does not run on a tf.data service.")

    def batch_size(self, cfg) -> int:
        return get(cfg, self.batch_knob)

    def batching(self, cfg, spec, replicas: int) -> tuple[int, int]:
        """(the global batch, steps in one pass over the training split)."""
        knobs, global_batch = get(cfg, self.pipeline_key), self.batch_size(cfg) * replicas
        if knobs.drop_remainder and global_batch > spec.num_train:
            key = self.batch_knob
            raise UserError(
                f"{key} ({self.batch_size(cfg)}"
                + (f" per replica, {global_batch} over {replicas} replicas" if replicas > 1 else "")
                + f") is larger than the training split of {spec.root} ({spec.num_train} examples), so drop_remainder "
                f"would leave no batch at all. Lower {key} or set {self.pipeline_key}.drop_remainder=false."
            )
        whole = spec.num_train // global_batch if knobs.drop_remainder else -(-spec.num_train // global_batch)
        return global_batch, max(1, whole)

    def batch_override(self, cfg, spec, batch: int) -> str:
        """The --set that gives `cfg` a batch of `batch` (sweep-batch)."""
        return f"{self.batch_knob}={batch}"

    # The input pipeline
    def build_dataset(
        self, cfg, spec, *, split: str, training: bool, batch_size: int, seed: int, files=None, damaged=None
    ):
        """The pipeline of a resolved config for `split` (train or validation; `files`: some of its files)."""
        raise NotImplementedError

    def describe_pipeline(self, cfg, spec, batch_size: int) -> str:
        return f"batch({batch_size})"

    def caches(self, cfg) -> bool:
        """Whether the resolved pipeline caches (its first epoch fills the cache)."""
        return False

    def ceiling(self, dataset, epoch_steps: int, batch_size: int):
        """The model at zero input cost: (a dataset from memory, its description)."""
        import tensorflow as tf

        batch = next(iter(dataset))
        cached = tf.data.Dataset.from_tensors(batch).repeat().prefetch(2)
        return cached, f"one cached batch of {batch_size} repeated (zero input cost)"

    # The model
    def model_input(self, cfg, spec):
        """The `input_shape` the registry's model builders get."""
        raise NotImplementedError

    def build_model(self, cfg, spec):
        from train import models

        return models.build_model(cfg.model.name, self.model_input(cfg, spec), spec.num_classes, cfg.model.params)

    def metrics(self, cfg) -> dict:
        """model.compile's metrics arguments."""
        from train import models

        return {"metrics": models.metrics()}

    def export(self, cfg, spec, model, run_dir: Path) -> None:
        """What a finished run leaves besides model.keras."""

    # What its runs and benchmarks measure
    def counter(self):
        """None: a step consumes the global batch of examples. Else an object with `wrap(dataset)` (counts what
        each batch holds as the step takes it) and `count()` (the total so far, in `unit`)."""
        return None

    def meter(self, warmup_steps: int, logdir: Path, jit_compile: bool, run_dir: Path, chief: bool, profiler=None):
        """None, or what a run measures beside step time: `wrap(dataset)`, `callback` (a Keras callback) and
        `finish()` -> (figures for summary.json under the workload's name, examples/s or None). `profiler`: the
        run's StepTraceProfiler or None; the steps it traces (`profiler.tracing` at a step's start) run slower
        and are left out of steady-state figures, as the step timer leaves them out."""
        return None

    def describe_figures(self, figures: dict | None) -> str:
        """The run's own figures in its last log line."""
        return ""

    def pipeline_cost(self, cfg, spec, global_batch: int, epoch_steps: int, seconds: float) -> dict:
        """The pipeline alone, without the model: CPU time per example and memory, caches filled first."""
        from train.measure.alone import pull

        (examples,), cpu, elapsed, growth = pull(
            lambda: iter(
                self.build_dataset(
                    cfg, spec, split="train", training=True, batch_size=global_batch, seed=cfg.train.seed
                )
            ),
            epoch_steps + 2 if self.caches(cfg) else 2,
            seconds,
            lambda batch: (global_batch,),
        )
        return {
            "core_seconds_per_example": cpu / examples,
            "examples_per_sec_alone": examples / elapsed,
            "memory_growth_mb": growth,
        }

    def decode_floor(self, cfg, spec, seconds: float) -> dict:
        """bench (features.decode_floor): what decoding alone costs per example, one thread."""
        raise UserError(f"The {self.name} workload has no decode floor.")

    def cost_figures(self, cost: dict, floor: dict | None, ceiling_rate: float) -> dict:
        """bench: what a pipeline's cost means against the model's rate (and the decode floor)."""
        return {"cores_to_feed_device": cost["core_seconds_per_example"] * ceiling_rate}

    def cost_lines(self, result: dict) -> list[str]:
        """bench's lines on each pipeline alone."""
        lines = []
        for name, cost in result["pipeline_cost"].items():
            lines.append(
                f"{name}: {cost['core_seconds_per_example'] * 1e3:.3f} core-ms per example alone "
                f"({cost['examples_per_sec_alone']:,.0f} ex/s); {cost['cores_to_feed_device']:.2g} cores to feed the "
                f"model (this host has {result['host_cores']}); memory +{cost['memory_growth_mb']:,.0f} MB"
            )
        return lines + [f"peak RSS of the largest variant's process: {result['peak_rss_mb']:,.0f} MB"]

    def snapshot(self, cfg, spec) -> dict | None:
        """bench: where a resolved config caches on disk (and the --set without it), or None."""
        return None

    # make tune
    def tune_space(self, cfg, spec, found, *, replicas: int = 1, batch: bool = False) -> list[Knob]:
        """The knobs tune searches for this config (as loaded), dataset and machine, most promising first."""
        return train_knobs(found)

    def vet(self, candidate, best, spec, replicas: int, start) -> str | None:
        """Why a candidate (resolved) is not worth measuring against the best (resolved), or None."""
        if (candidate.sections, candidate.train) == (best.sections, best.train):
            return "the same settings once auto is resolved"
        return None

    # Reports
    def report_row(self, summary: dict) -> dict:
        """compare: the values of `report_rows` (and any that replace the shared ones) from a run's summary."""
        return {}

    def report_lines(self, report: dict) -> list[str]:
        """compare: paragraphs of report.md after the pipelines."""
        return []

    def bar_label(self, value: float, row: dict) -> str:
        return f"{value:,.0f}"

    def hparams(self, config: dict) -> dict:
        """The ladder's TensorBoard hparams of a resolved config (as config.yaml holds it)."""
        t = config["train"]
        return {
            "batch_size": get_key(config, self.batch_knob),
            "precision": str(t["precision"]),
            "jit_compile": str(t["jit_compile"]),
            "steps_per_execution": str(t["steps_per_execution"]),
            "strategy": t["strategy"],
        }


def get_key(values: dict, dotted: str):
    for part in dotted.split("."):
        values = values[part]
    return values
