"""One run set-up, whatever loop runs it: everything before the first step (`prepare`).

    config -> its workload (train/workloads/) finds the dataset it was built into
           -> the plan (plan.py: every `auto` decided for the detected devices and the dataset,
              the strategy, the global batch) -> the workload checks the data
           -> run folder, fresh or where a run stopped, with the resolved config (run_folder.py)
           -> this process's place in the cluster (task.py) -> seeds
           -> ... a loop builds the model (compiled_model.py) and trains ...
           -> summary.json, one schema (run_summary.py)

The Keras `fit` loop (fit_loop.py), the multi-worker custom loop (multi_worker.py) and the
benchmarks (benchmarks/trials.py, through plan.py) all start here, so a run means the same thing
wherever it runs. Batch size has one meaning: the workload's batch size knob is per replica; the
global batch is derived once, in the plan, and passed explicitly to the pipeline and the step timers.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from train import workloads
from train.config import Config
from train.core.errors import UserError
from train.shards import integrity
from train.training import devices, run_folder
from train.training.plan import plan
from train.training.run_setup import RunSetup
from train.training.task import Task, current_task


def prepare(
    cfg: Config, *, config_path: str | None = None, build_hint: str = "make data", fresh: bool = False, log=print
) -> RunSetup:
    """Everything before the first step: the plan, data checks, run folder, seeds."""
    workload = workloads.get(cfg.workload)
    spec = workload.locate(cfg, build_hint)
    found = devices.detect()
    made = plan(cfg, found, spec)
    cfg, choices = made.cfg, made.choices
    if cfg.train.strategy == "multi_worker" and not workload.features.multi_worker:
        raise UserError(
            "train.strategy is multi_worker (set, or `auto` under TF_CONFIG), which the multi-worker loop does not "
            f"run for the {workload.name} workload yet (it builds sharded image pipelines). Train in one process: "
            "unset TF_CONFIG, or set train.strategy to default or mirrored."
        )
    task = current_task() if cfg.train.strategy == "multi_worker" else Task()
    setup = RunSetup(
        cfg, spec, found, choices, made.strategy, task, made.global_batch, made.steps_per_epoch, config_path, build_hint
    )
    setup.epoch_steps = made.epoch_steps
    setup.damaged, setup.skipped = workload.check_data(cfg, spec, build_hint)
    if task.is_chief:
        setup.resume = run_folder.prepare(cfg, fresh)
        run_folder.save_config(cfg, found, choices)
    else:
        setup.resume = run_folder.resume_point(cfg, fresh)
    _log_setup(setup, log)
    if setup.skipped:
        log(f"{setup.tag} skip_corrupt: skipping {integrity.describe(setup.skipped)}")
    keras.utils.set_random_seed(cfg.train.seed)
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    return setup


def _log_setup(setup: RunSetup, log) -> None:
    cfg, choices, replicas = setup.cfg, setup.choices, setup.replicas
    per_replica = setup.workload.batch_size(cfg)
    log(f"{setup.tag} device: {setup.found.describe()}")
    log(f"{setup.tag} pipeline: {setup.describe_pipeline()}")
    log(
        f"{setup.tag} precision={choices.precision} jit_compile={choices.jit_compile} "
        f"steps_per_execution={choices.steps_per_execution} strategy={choices.strategy}"
        + (
            f" replicas={replicas} batch_size={per_replica}/replica global_batch={setup.global_batch}"
            if replicas > 1
            else ""
        )
        + (" deterministic" if cfg.train.deterministic else "")
    )


def data_error(error: Exception, setup: RunSetup) -> Exception:
    """A clear error naming the damaged shard and record, when the data is what failed."""
    return setup.workload.data_error(error, setup.spec, setup.build_hint)
