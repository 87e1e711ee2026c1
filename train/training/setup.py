"""One run set-up, whatever loop runs it: everything before the first step.

    config -> the dataset (images: shards/catalog via sources.py; task: text, train/workloads/text/build.py)
           -> the plan (plan.py: every `auto` decided for the detected devices and the dataset,
              the strategy, the global batch) -> data checked (data_checks.py)
           -> run folder, fresh or where a run stopped, with the resolved config (run_folder.py)
           -> this process's place in the cluster (task.py) -> seeds
           -> ... a loop builds the model (compiled_model.py) and trains ...
           -> summary.json, one schema (run_summary.py)

The Keras `fit` loop (fit_loop.py), the multi-worker custom loop (multi_worker.py) and the
benchmarks (benchmarks/trials.py, through plan.py) all start here, so a run means the same thing
wherever it runs. Batch size has one meaning: `pipeline.batch_size` is per replica; the global
batch is derived once, in the plan, and passed explicitly to the pipeline and the step timers.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from train import sources
from train.config import Config
from train.core.errors import UserError
from train.shards import integrity
from train.training import data_checks, devices, run_folder
from train.training.compiled_model import build_model
from train.training.plan import Plan, check_batch_size, plan, resolve, warmup_steps
from train.training.run_setup import RunSetup
from train.training.run_summary import finish, summary
from train.training.strategy import make_strategy
from train.training.task import Task, current_task
from train.workloads.text import build as text_build

# What the loops (fit_loop, multi_worker) and the benchmarks import from here; all but prepare and
# data_error live in the modules imported above.
__all__ = [
    "RunSetup",
    "prepare",
    "data_error",
    "build_model",
    "Plan",
    "plan",
    "resolve",
    "check_batch_size",
    "warmup_steps",
    "make_strategy",
    "finish",
    "summary",
]


def prepare(
    cfg: Config, *, config_path: str | None = None, build_hint: str = "make data", fresh: bool = False, log=print
) -> RunSetup:
    """Everything before the first step: the plan, data checks, run folder, seeds."""
    if cfg.task == "text":
        spec = text_build.locate(cfg.text.data, build_hint)
    else:
        spec = sources.locate(cfg.data, build_hint)
    found = devices.detect()
    made = plan(cfg, found, spec)
    cfg, choices = made.cfg, made.choices
    if cfg.task == "text" and cfg.train.strategy == "multi_worker":
        raise UserError(
            "train.strategy is multi_worker (set, or `auto` under TF_CONFIG), which is not wired for task: text yet "
            "(the multi-worker loop builds image pipelines). Train text in one process: unset TF_CONFIG, or set "
            "train.strategy to default or mirrored."
        )
    task = current_task() if cfg.train.strategy == "multi_worker" else Task()
    setup = RunSetup(
        cfg, spec, found, choices, made.strategy, task, made.global_batch, made.steps_per_epoch, config_path, build_hint
    )
    if cfg.task == "image":  # a text dataset is checked when built (bad rows, cut texts: its spec counts them)
        data_checks.verify(cfg, spec, build_hint)
    if task.is_chief:
        setup.resume = run_folder.prepare(cfg, fresh)
        run_folder.save_config(cfg, found, choices)
    else:
        setup.resume = run_folder.resume_point(cfg, fresh)
    _log_setup(setup, log)
    readable = data_checks.readable(cfg, spec) if cfg.task == "image" else data_checks.Readable()
    setup.damaged, setup.skipped = readable.damaged, readable.skipped
    if setup.skipped:
        log(f"{setup.tag} skip_corrupt: skipping {integrity.describe(setup.skipped)}")
    keras.utils.set_random_seed(cfg.train.seed)
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    return setup


def _log_setup(setup: RunSetup, log) -> None:
    cfg, choices, replicas = setup.cfg, setup.choices, setup.replicas
    log(f"{setup.tag} device: {setup.found.describe()}")
    log(f"{setup.tag} pipeline: {setup.describe_pipeline()}")
    log(
        f"{setup.tag} precision={choices.precision} jit_compile={choices.jit_compile} "
        f"steps_per_execution={choices.steps_per_execution} strategy={choices.strategy}"
        + (
            f" replicas={replicas} batch_size={cfg.pipeline.batch_size}/replica global_batch={setup.global_batch}"
            if replicas > 1
            else ""
        )
        + (" deterministic" if cfg.train.deterministic else "")
    )


def data_error(error: Exception, setup: RunSetup) -> Exception:
    """A clear error naming the damaged shard and record, when the data is what failed."""
    if setup.cfg.task == "text":
        return error
    return data_checks.data_error(error, setup.spec, setup.build_hint)
