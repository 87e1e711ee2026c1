"""One benchmark variant in a process of its own: `python -m train.benchmarks.worker --reply-fd N`.

The parent (isolated.py) sends one JSON command per line on stdin and reads one JSON reply per
line on the file descriptor it passed; between commands it stops this process (SIGSTOP), so
nothing here runs while another variant is measured. Commands:

    prepare  {config, name, ceiling, service_workers, warmup_seconds, quiet}  -> facts (again: replaces the variant)
    trial    {seconds, min_calls}                                         -> {"rate": examples/s}
    renew    {}: a fresh iterator over the same pipeline, warmed up         -> {"warmup_seconds": ...}
    profile  {logdir, num_steps}                                          -> {"profile": dict | null}
    cost     {config, seconds}: the input pipeline alone, no model        -> trials.pipeline_cost(...)
    floor    {config, seconds}: decoding alone, one thread                -> the workload's decode_floor(...)
    memory   {}                                                            -> {"peak_rss_mb": ...}

A failure is replied as {"error": message, "kind": "user" | "candidate" | "bug", "type": name}:
`user` for a UserError, `candidate` for what a config can fail at on this machine (a
TensorFlow op error such as out of memory or an XLA compile error, MemoryError), `bug` for
anything else, so that a caller never mistakes a programming error for a slow candidate.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import os
import signal
import sys
import traceback

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies (a stopped worker cannot
    notice on its own); elsewhere the parent's cleanup is all there is."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def classify(error: BaseException) -> str:
    from train.core.errors import UserError

    if isinstance(error, UserError):
        return "user"
    if isinstance(error, MemoryError):
        return "candidate"
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        if isinstance(error, tf.errors.OpError):
            return "candidate"
    return "bug"


class Worker:
    def __init__(self):
        self.variant = None
        self.cluster = None

    def prepare(self, config: str, name: str, ceiling: bool, service_workers: int, warmup_seconds: float, quiet: bool):
        """Make a variant ready; a second call replaces this process's variant with another (the crossover of
        isolated.pair_round): the first is released before the second is built."""
        self.close()
        from train import config as config_lib
        from train import workloads
        from train.benchmarks import trials
        from train.training import devices

        cfg = config_lib.load(config, name=name)
        workload = workloads.get(cfg.workload)
        if cfg.train.strategy == "mirrored" and cfg.train.cpu_replicas > 1:
            import tensorflow as tf

            if not tf.config.list_physical_devices("GPU"):
                devices.split_cpu(cfg.train.cpu_replicas)
        spec = workload.locate(cfg)
        if service_workers:
            from train.input import service

            self.cluster = service.LocalCluster(service_workers)
            cfg = workload.with_data_service(cfg, self.cluster.target)
        found = devices.detect()
        log = (lambda line: None) if quiet else (lambda line: print(line, flush=True))
        self.variant = variant = trials.prepare(
            name, cfg, spec, found, ceiling=ceiling, warmup_seconds=warmup_seconds, log=log
        )
        return {
            "description": variant.description,
            "batch_size": variant.batch_size,
            "unit": variant.unit,
            "replicas": variant.replicas,
            "precision": variant.choices.precision,
            "jit_compile": variant.choices.jit_compile,
            "steps_per_execution": variant.choices.steps_per_execution,
            "strategy": variant.choices.strategy,
            "config": config_lib.to_dict(variant.cfg),
            "device": found.describe(),
            "cpu_cores": found.cpu_cores,
            "warmup_seconds": variant.warmup_seconds,
        }

    def trial(self, seconds: float, min_calls: int):
        return {"rate": self.variant.trial(seconds, min_calls)}

    def renew(self):
        return {"warmup_seconds": self.variant.renew()}

    def profile(self, logdir: str, num_steps: int):
        from pathlib import Path

        return {"profile": self.variant.profile(Path(logdir), num_steps)}

    def cost(self, config: str, seconds: float):
        from train import config as config_lib
        from train import workloads
        from train.benchmarks import trials
        from train.training import devices

        cfg = config_lib.load(config)
        return trials.pipeline_cost(cfg, workloads.get(cfg.workload).locate(cfg), devices.detect(), seconds)

    def floor(self, config: str, seconds: float):
        from train import config as config_lib
        from train import workloads

        cfg = config_lib.load(config)
        workload = workloads.get(cfg.workload)
        return workload.decode_floor(cfg, workload.locate(cfg), seconds)

    def memory(self):
        import resource

        return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def close(self) -> None:
        if self.variant is None and self.cluster is None:
            return
        import gc

        self.variant = None  # releases the iterator (and any service job) before the cluster stops
        gc.collect()
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


def serve(commands, reply) -> None:
    worker = Worker()
    try:
        for line in commands:
            request = json.loads(line)
            command = request.pop("command")
            if command == "exit":
                break
            try:
                result = getattr(worker, command)(**request)
            except Exception as error:  # sent to the parent, which decides by `kind`
                result = {
                    "error": f"{type(error).__name__}: {error}",
                    "kind": classify(error),
                    "type": type(error).__name__,
                    "traceback": traceback.format_exc(),
                }
            reply.write(json.dumps(result, default=float) + "\n")
            reply.flush()
    finally:
        worker.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reply-fd", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for the stacks of a stalled worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes the workers
    from train.core.quiet import import_tensorflow

    import_tensorflow()
    with os.fdopen(args.reply_fd, "w") as reply:
        serve(sys.stdin, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
