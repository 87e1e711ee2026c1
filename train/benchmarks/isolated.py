"""Variants that cannot disturb each other: each in its own process, stopped while another is measured.

On a machine whose cores the model and the input pipeline share, a variant that is not being
measured still works: its tf.data threads refill the buffers the last trial drained (and an
autotuned, long-running pipeline has larger ones). In one process that work cannot be paused,
and it lands in whichever variant is measured next. Here each variant is a worker process
(worker.py) that the parent stops with SIGSTOP as soon as a command has been answered and
continues (SIGCONT) only to run the next one, so exactly one variant runs at a time and each
finds its pipeline as it left it. Measured before choosing (docs/figures.md, "Why trials are
isolated"): see bench-check for the A/A and order checks that hold this to account.

`IsolatedVariant` has what the benchmarks read of `trials.Variant`: name, samples, trial(),
profile(), stats(), batch_size, replicas, description, the resolved config and choices.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from train import config as config_lib
from train.benchmarks import stats
from train.config import Config
from train.core.errors import UserError

WORKER_START_TIMEOUT_S = 600.0  # a first epoch that fills a cache of a large dataset takes a while
# A worker that spends no CPU time for STALL_S while a command is out waits on something nothing will wake: once, on
# the Intel kind, a worker dropping a tf.data iterator sat 2.5 minutes with every thread in a futex wait, and went on
# the moment a debugger attached (which stops and continues every thread). The parent does the same: it dumps the
# worker's Python stacks, stops and continues it, up to STALL_NUDGES times, then gives the variant up as failed.
STALL_S = 60.0
STALL_NUDGES = 3
POLL_S = 5.0
stalls: list[str] = []  # every stall a worker of this process was stopped and continued out of, for the reports


class VariantFailed(RuntimeError):
    """A variant could not run on this machine (out of memory, an op or XLA compile error, a worker
    that died): the config is valid but this machine cannot run it. Tune skips such a candidate;
    anything else a worker raises is a bug and is raised as one."""


class WorkerBug(RuntimeError):
    """A programming error inside a worker: never taken for a slow or failed candidate."""


@dataclasses.dataclass
class Facts:
    description: str
    batch_size: int
    replicas: int
    precision: str
    jit_compile: bool
    steps_per_execution: int
    strategy: str
    config: dict  # the resolved config (every `auto` decided), as config.yaml holds it
    device: str
    cpu_cores: int
    warmup_seconds: float
    unit: str = "examples/s"  # what a trial's rate counts: real tokens/s for text


class Worker:
    """A `python -m train.benchmarks.worker` process, stopped between commands. `program` replaces that module
    (tests: a process that speaks the same protocol)."""

    def __init__(self, label: str, program: list[str] | None = None, stall_s: float = STALL_S, poll_s: float = POLL_S):
        self.label = label
        self.folder = Path(tempfile.mkdtemp(prefix="bench-worker-"))
        read_end, write_end = os.pipe()
        self.process = subprocess.Popen(
            (program or [sys.executable, "-m", "train.benchmarks.worker"]) + ["--reply-fd", str(write_end)],
            stdin=subprocess.PIPE,
            pass_fds=(write_end,),
            text=True,
        )
        os.close(write_end)
        self.replies = os.fdopen(read_end, "r")
        self.stopped = self.busy = False
        self.stall_s, self.poll_s = stall_s, poll_s
        self.nudges = 0  # stalls this worker was stopped and continued out of, over its life

    def config_file(self, cfg: Config, name: str) -> str:
        path = self.folder / f"{name}.yaml"
        config_lib.save(cfg, path)
        return str(path)

    def _signal(self, number: int) -> None:
        try:
            self.process.send_signal(number)
        except ProcessLookupError:
            pass

    def _died(self, when: str) -> VariantFailed:
        code = self.process.returncode
        how = f"signal {-code}" if code < 0 else f"exit {code}"
        return VariantFailed(f"{self.label}: its worker process died {when} ({how})")

    def _stop(self) -> None:
        """SIGSTOP, and wait until the kernel has stopped it: the next trial starts with this one still."""
        self._signal(signal.SIGSTOP)
        try:
            _, status = os.waitpid(self.process.pid, os.WUNTRACED)
        except ChildProcessError:
            return
        if not os.WIFSTOPPED(status):  # it ended instead: record how, as Popen.wait would
            self.process.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self.stopped = True

    def _continue(self) -> None:
        self._signal(signal.SIGCONT)
        self.stopped = False

    def _cpu_seconds(self) -> float | None:
        try:
            times = psutil.Process(self.process.pid).cpu_times()
        except psutil.Error:
            return None
        return times.user + times.system

    def _await_reply(self, command: str) -> tuple[str, bool]:
        """The worker's reply line ("" where it died), and whether it had to be nudged out of a stall on the way."""
        nudged, spent, still_since = 0, self._cpu_seconds(), time.monotonic()
        while not select.select([self.replies], [], [], self.poll_s)[0]:
            now = self._cpu_seconds()
            if now is None or now != spent:
                spent, still_since = now, time.monotonic()
                continue
            if time.monotonic() - still_since < self.stall_s:
                continue
            if nudged == STALL_NUDGES:
                self.process.kill()
                self.process.wait()
                raise VariantFailed(
                    f"{self.label}: its worker used no CPU time for {self.stall_s:g} s during '{command}', "
                    f"{nudged + 1} times in a row, and was stopped and continued in between: it waits on something "
                    "that will not come. Killed; its Python stacks are in the log above."
                )
            self._signal(signal.SIGUSR1)  # the worker's faulthandler writes its threads' stacks to stderr
            self._stop()
            self._continue()
            nudged += 1
            self.nudges += 1
            stalls.append(f"{self.label} during '{command}'")
            print(
                f"  {self.label}: no CPU time used for {self.stall_s:g} s during '{command}': stopped and continued "
                f"it ({nudged} of {STALL_NUDGES}; its Python stacks are above)",
                file=sys.stderr,
                flush=True,
            )
            still_since = time.monotonic()
        return self.replies.readline(), nudged > 0

    def call(self, command: str, **arguments) -> dict:
        """Continue the worker, run one command, stop it again; its failure is raised by kind."""
        if self.process.poll() is not None:
            raise self._died("earlier")
        if self.stopped:
            self._continue()
        self.busy = True
        self.process.stdin.write(json.dumps({"command": command, **arguments}) + "\n")
        self.process.stdin.flush()
        line, nudged = self._await_reply(command)
        self.busy = False
        if not line:
            self.process.wait()
            raise self._died(f"during '{command}'")
        self._stop()
        reply = json.loads(line)
        if nudged and command == "trial" and "error" not in reply:
            # its rate counts the stall: measured again
            print(f"  {self.label}: the trial it stalled in is measured again", file=sys.stderr, flush=True)
            return self.call(command, **arguments)
        if "error" in reply:
            if reply["kind"] == "user":
                raise UserError(reply["error"].split(": ", 1)[-1])
            if reply["kind"] == "candidate":
                raise VariantFailed(f"{self.label}: {reply['error']}")
            raise WorkerBug(f"{self.label}: {command} failed in its worker:\n{reply['traceback']}")
        return reply

    def close(self) -> None:
        """Let an idle worker exit; one interrupted mid-command (Ctrl-C) is killed: it holds nothing to save."""
        if self.busy and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.poll() is None:
            self._continue()
            try:
                self.process.stdin.write(json.dumps({"command": "exit"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.replies.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class IsolatedVariant:
    """One config made ready to run in its own worker process (see the module's docstring)."""

    def __init__(
        self,
        name: str,
        cfg: Config,
        *,
        ceiling: bool = False,
        service_workers: int = 0,
        warmup_seconds: float = 2.0,
        log: Callable[[str], None] = print,
    ):
        self.name, self.cfg, self.samples = name, cfg, []
        self.how = {"ceiling": ceiling, "service_workers": service_workers, "warmup_seconds": warmup_seconds}
        self.worker = Worker(name)
        started = time.perf_counter()
        try:
            self.facts = self.prepare_in(self.worker, quiet=log is None)
        except BaseException:
            self.worker.close()
            raise
        self.prepare_seconds = time.perf_counter() - started

    def prepare_in(self, worker: Worker, quiet: bool = True) -> Facts:
        """This variant's config made ready in `worker` (its own at first; the other's in a crossover)."""
        reply = worker.call(
            "prepare", config=worker.config_file(self.cfg, "variant"), name=self.name, quiet=quiet, **self.how
        )
        return Facts(**reply)

    @property
    def description(self) -> str:
        return self.facts.description

    @property
    def batch_size(self) -> int:
        return self.facts.batch_size

    @property
    def replicas(self) -> int:
        return self.facts.replicas

    @property
    def steps_per_call(self) -> int:
        return self.facts.steps_per_execution

    def trial(self, seconds: float, min_calls: int = 3) -> float:
        rate = self.worker.call("trial", seconds=seconds, min_calls=min_calls)["rate"]
        self.samples.append(rate)
        return rate

    def renew(self) -> float:
        """A fresh pipeline (iterator) in the same process, warmed up as `prepare` warms one: trials.Variant.renew."""
        return self.worker.call("renew")["warmup_seconds"]

    def profile(self, logdir: Path, num_steps: int = 8) -> dict | None:
        return self.worker.call("profile", logdir=str(logdir), num_steps=num_steps)["profile"]

    def stats(self) -> dict:
        return stats.summarize(self.samples)

    def peak_rss_mb(self) -> float:
        return self.worker.call("memory")["peak_rss_mb"]

    def view(self, name: str) -> View:
        """The same variant under another name with samples of its own (A/A: measured twice a round)."""
        return View(name, self)

    def close(self) -> None:
        self.worker.close()

    def __enter__(self) -> IsolatedVariant:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class View:
    """Another name for an IsolatedVariant, with its own samples: the second A of an A/A pair."""

    def __init__(self, name: str, variant: IsolatedVariant):
        self.name, self.variant, self.samples = name, variant, []

    def trial(self, seconds: float, min_calls: int = 3) -> float:
        rate = self.variant.worker.call("trial", seconds=seconds, min_calls=min_calls)["rate"]
        self.samples.append(rate)
        return rate

    def stats(self) -> dict:
        return stats.summarize(self.samples)


def measure_alone(command: str, cfg: Config, seconds: float) -> dict:
    """Run `cost` or `floor` in a fresh worker of its own, nothing else running: CPU time per example."""
    worker = Worker(command)
    try:
        return worker.call(command, config=worker.config_file(cfg, command), seconds=seconds)
    finally:
        worker.close()


def worker_of(variant) -> Worker:
    return variant.variant.worker if isinstance(variant, View) else variant.worker


def schedule(variants: list, rounds: int) -> list[list]:
    """Each round's order: rotated by one each round (A B C, B C A, ...) so a slow drift of a shared
    machine hits every variant, then rearranged so that no trial directly follows a trial of the
    same process, across rounds too: every trial then starts after the same kind of pause."""
    orders, previous = [], None
    for index in range(rounds):
        shift = index % len(variants)
        pending, order = variants[shift:] + variants[:shift], []
        while pending:
            last = worker_of(order[-1]) if order else previous
            pick = next((v for v in pending if worker_of(v) is not last), pending[0])
            pending.remove(pick)
            order.append(pick)
        orders.append(order)
        previous = worker_of(order[-1])
    return orders


def interleaved(
    variants: list, trials: int, seconds: float, log: Callable[[str], None] = print, min_calls: int = 3
) -> None:
    """Measure every variant `trials` times in `schedule`'s order; each round's ratios are paired
    (stats.paired). A variant measured twice a round (an A/A view) is never measured twice in a row.

    First every process renews its pipeline, one after the other (a fresh iterator, warmed up as a
    new variant is): the variants compared then have pipelines of the same age, whichever process
    ran longer before. A long-running base and a fresh candidate of one config read x1.04 apart
    (larger-than-memory bench-check), and what differs with a pipeline's age is its state, not its
    config: tf.data's prefetch autotuning only ever grows its buffer (1, 2, 4, then 8 batches over
    a larger-than-memory variant's first minute of trials; AA-NOTES.md). Then one unrecorded trial
    of each process: a variant that stayed stopped while the others renewed resumes with autotuning
    statistics that count that pause (tf.data times its stages by the wall clock); one trial lets
    them settle.
    """
    processes = list(dict.fromkeys(worker_of(variant) for variant in variants))
    for process in processes:
        process.call("renew")
    for process in processes:
        process.call("trial", seconds=seconds, min_calls=min_calls)
    for round_index, order in enumerate(schedule(variants, trials)):
        rates = {v.name: v.trial(seconds, min_calls) for v in order}
        log(f"  trial {round_index + 1}/{trials}: " + ", ".join(f"{n} {r:,.0f}/s" for n, r in rates.items()))


@dataclasses.dataclass
class Pair:
    """A base and a candidate measured in the same rounds (pair_round)."""

    ratios: list[float]  # per crossed round: candidate / base (pair_round)
    aa_ratios: list[float]  # per round of both halves: the base's second trial / its first (A/A)
    base: list[float]  # per crossed round: the base's examples/s (geometric mean of the two halves' round means)
    candidate: list[float]
    samples: dict  # every trial, per round of both halves: base, candidate, base (again), candidate (again)
    # the process the candidate ran in first over the base's first (its own: the one made second), measured from
    # the two halves (square root of their ratio): what the crossing cancels, and how large it was this time
    process_factor: float = 1.0


def _half(base, candidate, rounds: int, seconds: float, log: Callable[[str], None], min_calls: int) -> list[list]:
    """Base and candidate each measured twice a round, alternating (B C B C, so no trial follows one of the same
    process): [base, candidate, base again, candidate again], each a list of per-round rates."""
    views = [base.view(base.name), candidate.view(candidate.name)]
    views += [base.view(f"{base.name} (again)"), candidate.view(f"{candidate.name} (again)")]
    interleaved(views, rounds, seconds, log=log, min_calls=min_calls)
    return [list(v.samples) for v in views]


def _devices(cfg: Config) -> tuple:
    """What a process fixes when TensorFlow starts: the logical CPUs a mirrored variant splits (trials.begin)."""
    return (cfg.train.strategy, cfg.train.cpu_replicas if cfg.train.strategy == "mirrored" else 1)


def exchange(base: IsolatedVariant, candidate: IsolatedVariant, log: Callable[[str], None] = print) -> None:
    """Each variant's config made ready in the other's process, the candidate's first, and the processes swapped
    between the two variants: each config then runs where the other ran, prepared in the other order. Where the two
    need different devices (a mirrored variant over logical CPUs), two new processes instead, the candidate's made
    first: the order of the processes flips all the same."""
    base_worker, candidate_worker = base.worker, candidate.worker
    if _devices(base.cfg) != _devices(candidate.cfg):
        fresh = [Worker(candidate.name), Worker(base.name)]
        try:
            candidate.facts = candidate.prepare_in(fresh[0])
            base.facts = base.prepare_in(fresh[1])
        except BaseException:
            for worker in fresh:
                worker.close()
            raise
        base.worker, candidate.worker = fresh[1], fresh[0]
        base_worker.close()
        candidate_worker.close()
        log(f"  exchanged: {candidate.name} and {base.name} made again in new processes, {candidate.name}'s first")
        return
    candidate.facts = candidate.prepare_in(base_worker)
    base.facts = base.prepare_in(candidate_worker)
    base.worker, candidate.worker = candidate_worker, base_worker
    log(f"  exchanged: {candidate.name} now runs in {base.name}'s process and {base.name} in {candidate.name}'s")


def pair_round(base, candidate, rounds: int, seconds: float, log: Callable[[str], None] = print, min_calls: int = 3):
    """The candidate against the base in a crossover: half the rounds with each in its own process, then each
    config prepared again in the other's process (exchange), the other half. Each round is paired with its
    counterpart of the other half (geometric mean of the two ratios), so whatever belongs to a process rather
    than to a config cancels: a process created second read 2-6 % faster than the first on the Intel kind,
    whichever config it ran (docs/benchmarks.md, "Why comparisons are crossed"). Each config is measured twice a
    round, which also gives the base's A/A noise at that very time.
    """
    half = max(1, math.ceil(rounds / 2))
    first = _half(base, candidate, half, seconds, log, min_calls)
    exchange(base, candidate, log=log)
    second = _half(base, candidate, half, seconds, log, min_calls)

    def means(trials: list[list]) -> list[float]:
        once, again = trials
        return [(a + b) / 2 for a, b in zip(once, again)]

    crossed = {
        role: [math.sqrt(a * b) for a, b in zip(means(first[i::2]), means(second[i::2]))]
        for role, i in (("base", 0), ("candidate", 1))
    }

    def candidate_over_base(trials: list[list]) -> float:
        return statistics.median(stats.paired(means(trials[1::2]), means(trials[0::2])))

    names = ("base", "candidate", "base (again)", "candidate (again)")
    return Pair(
        ratios=stats.paired(crossed["candidate"], crossed["base"]),
        aa_ratios=stats.paired(first[2], first[0]) + stats.paired(second[2], second[0]),
        base=crossed["base"],
        candidate=crossed["candidate"],
        samples={name: a + b for name, a, b in zip(names, first, second)},
        process_factor=math.sqrt(candidate_over_base(first) / candidate_over_base(second)),
    )


def close_all(variants) -> None:
    for variant in variants:
        if isinstance(variant, IsolatedVariant):
            variant.close()
