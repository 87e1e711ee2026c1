"""One profile's input wait as the input causes read it: the pipeline's figures, and the wait charged to one stage.

The causes (diagnose/input_causes.py) and the structural fixes (diagnose/structural.py) read the input wait's
record (diagnose/wait_record.py) through these, so that each figure, and each sentence about it, is made once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from step_doctor.diagnose import input_wait as iw
from step_doctor.diagnose import stages as st
from step_doctor.diagnose.cpu_budget import Budget, ProcessCpu
from step_doctor.diagnose.recommendation import Causes, ms, pct
from step_doctor.diagnose.stalls import left_out, working_step
from step_doctor.diagnose.wait_record import InputWait, Stage, StageFunctions

ASSUMED_CORES = 2  # where the profile does not record tf.data's cores (cpu_budget on its Root iterator)


@dataclass
class Pipeline:
    """One profile's input wait, as every input cause reads it."""

    wait: InputWait
    cpu_only: bool
    causes: Causes
    cpu: ProcessCpu | None = None  # what the process used over the profile's window, where it was recorded

    @property
    def stages(self) -> tuple[Stage, ...]:
        return self.wait.stages

    @property
    def step(self) -> float:
        return working_step(self.wait)

    @property
    def input_ms(self) -> float:
        return self.wait.input_ms or 0.0

    @property
    def other_ms(self) -> float:
        """The model's step and per-step overhead: what a prefetch could overlap."""
        return max(self.step - self.input_ms, 0.0)

    @property
    def cores(self) -> int:
        return self.wait.cpu_budget or ASSUMED_CORES

    @cached_property
    def budget(self) -> Budget:
        """The step's core-ms against its cores (diagnose/cpu_budget.py)."""
        step, cores = self.step, (self.cpu.cores if self.cpu else self.cores)
        work = sum(s.functions.work_ms for s in self.stages if s.functions)
        if self.cpu:
            used, measured = self.cpu.cpu_s / self.cpu.wall_s * step, True
        else:
            used, measured = min(work + self.wait.compute_ms + self.wait.overhead_ms, cores * step), False
        device = self.wait.device.busy_ms if self.wait.device and not self.cpu_only else 0.0
        return Budget(step, self.other_ms, cores, used, measured, device, work + self.other_ms)

    def removes(self, wait_ms: float = 0.0, work_ms: float = 0.0, covers_below: bool = False) -> float:
        """The step time a fix removes that shortens the wait by `wait_ms` and removes `work_ms` core-ms
        (`covers_below`: a cache's, counting the stages under its own)."""
        return self.budget.removes(wait_ms, work_ms, covers_below)

    @property
    def cores_note(self) -> str:
        if self.wait.cpu_budget:
            return f"the {self.cores} cores tf.data was given in this profile"
        return self.cores_unknown

    @property
    def cores_words(self) -> str:
        return f"{self.cores} cores" if self.wait.cpu_budget else self.cores_unknown

    @property
    def cores_unknown(self) -> str:
        return (
            f"{ASSUMED_CORES} cores (cores unknown: this profile does not record how many cores tf.data had; "
            f"{ASSUMED_CORES} is the fewest a parallel fix can use, a host with more gains more)"
        )

    @property
    def waits(self) -> str:
        stall = left_out(self.wait)
        without = f", without its {ms(stall)} stall" if stall > 0 else ""
        return (
            f"{pct(self.input_ms, self.step)} of step time ({ms(self.input_ms)} of {ms(self.step)}{without}) waits "
            "for input"
        )


def _own_work(s: Stage) -> float:
    """A stage's own core-ms per step: its function's calls, a reader's reading."""
    return s.functions.work_ms if s.functions else (s.busy_ms if s.kind in iw.READERS else 0.0)


def draws(shares: dict) -> bool:
    """Augmentation or Python ops in a function's op time: what it makes may differ every call."""
    return bool(shares.get("augmentation", 0.0) or shares.get("python", 0.0))


@dataclass
class Blame:
    """The wait charged to one stage (with the stages grouped under it), and that stage's facts."""

    unit: st.Unit
    pipeline: Pipeline

    @property
    def head(self) -> Stage:
        return self.unit.head

    @property
    def ms(self) -> float:
        return self.unit.blocking_ms

    @property
    def fn(self) -> StageFunctions | None:
        return self.head.functions

    @cached_property
    def shares(self) -> dict:
        return st.op_shares(self.fn)

    @property
    def concurrency(self) -> float:
        return (self.fn.concurrency if self.fn else None) or 1.0

    @property
    def text(self) -> str:
        step = self.pipeline.step
        return f"{self.pipeline.waits}; {ms(self.ms)} of it ({pct(self.ms, step)} of the step) on {st.name(self.head)}"

    @property
    def parallelism(self):
        return self.head.params.get("parallelism")

    @property
    def ran(self) -> str:
        return st.function_line(self.fn, self.parallelism)

    @property
    def after_cache(self) -> bool:
        """It reads a cache's output and decodes nothing: a map written after a cache is written there to run every
        epoch (augmentation), and stateless random ops (tf.random.stateless_*, seeded per element) can be missing
        from the trace (the template's per-example augmentation recorded none), so the trace cannot say it is fixed."""
        decodes = self.shares.get("decode", 0.0) or self.shares.get("file read", 0.0)
        # decoding ops outside the decode category's list (DecodeRaw, ParseTensor, ...): fixed, as decoding is
        decodes = decodes or any(op.startswith(("Decode", "Parse")) for op, _ in (self.fn.top_ops if self.fn else ()))
        return not decodes and any(st.is_cache(s) and st.under(s.path, self.head.path) for s in self.pipeline.stages)

    @property
    def varies(self) -> bool:
        """Augmentation or Python ops ran in its function, or in one under it that no cache keeps already: what a
        cache after it would keep may differ every epoch. Left out, a cache after a map that only checks shapes was
        offered at x11.2 over the sleeping Python lookup below it (held-out lookup_in_map)."""
        return any(draws(st.op_shares(s.functions)) for s in self.cached_stages)

    @cached_property
    def cached_stages(self) -> list[Stage]:
        """This stage and those under it that a cache after it would keep: down to a cache of their own."""
        below = [s for s in self.pipeline.stages if st.under(s.path, self.head.path)]
        kept = [c.path for c in below if st.is_cache(c)]
        return [self.head] + [s for s in below if not any(s.path == c or st.under(s.path, c) for c in kept)]

    @property
    def deterministic(self) -> bool:
        """Whether a cache after this stage keeps what every epoch makes anyway: nothing in its function varies, and
        it does not run after a cache."""
        return not (self.varies or self.after_cache)

    @property
    def uncached(self) -> str:
        """Why no cache is offered after a stage that runs after one (empty otherwise)."""
        if self.varies or not self.after_cache:
            return ""
        return (
            " It runs after a cache, where maps are written to run every epoch, so no cache is offered after it "
            "(random ops seeded per element may not show in the trace): if its ops are deterministic after all, "
            f"move the cache after it{self.cache_moves}."
        )

    @property
    def worked(self) -> float:
        """The part of the wait the stage's own function work explains: its blame, at most that work's wall time."""
        return min(self.ms, self.fn.wall_ms) if self.fn else self.ms

    @property
    def counted(self) -> str:
        """What an estimate built on `worked` leaves out, said where the trace shows less work than wait."""
        unseen = self.ms - self.worked
        if unseen < 0.1 * self.ms:
            return ""
        return (
            f" It counts the {ms(self.worked)} per step of the wait on this stage that its function's work explains; "
            f"the other {ms(unseen)} shows no work of it in the trace (hand-offs between its threads, or threads "
            "waiting for a core on a busy machine), which the fix may remove too."
        )

    @property
    def spread_over_cores(self) -> float:
        """The wait that spreading this stage's work over the pipeline's cores would remove."""
        return self.worked * max(1 - self.concurrency / self.pipeline.cores, 0.0)

    @property
    def spread(self) -> float:
        """The step time spreading the work removes, within the cores' budget (no work leaves)."""
        return self.pipeline.removes(self.spread_over_cores)

    @cached_property
    def work_below(self) -> float:
        """The core-ms per step of this stage's function and every stage under it (their functions, the readers):
        the work a cache after it removes from every epoch after the first."""
        return sum(_own_work(s) for s in self.cached_stages)

    @cached_property
    def wait_below(self) -> float:
        """The wait charged to the stages under this one outside its unit, as far as their own work explains it
        (their functions' wall time, a reader's reading): a cache after this stage serves every epoch after the first
        from memory, so their wait goes with its own. Left out, a cache after a map over files read one after
        another was estimated x1.30 where prove measured x7.0 (many_files_sequential, the reads its wait)."""
        outside = [s for s in self.cached_stages[1:] if all(s is not m for m in self.unit.members)]
        return sum(min(s.blocking_ms, s.functions.wall_ms if s.functions else _own_work(s)) for s in outside)

    @property
    def below_note(self) -> str:
        """What a cache after it removes beside its own wait, said where it counts (empty otherwise)."""
        if self.wait_below < 0.1:
            return ""
        return f", with the {ms(self.wait_below)} per step of wait on the stages under it (it keeps their work too)"

    @property
    def cached(self) -> float:
        """The step time a cache after this stage removes: its wait and the wait below it, and all that work from
        the cores."""
        return self.pipeline.removes(self.worked + self.wait_below, self.work_below, covers_below=True)

    def add(self, cause, title, removes_ms, evidence, fix, caveat=None, removes=None) -> None:
        self.pipeline.causes.add(cause, title, removes_ms, evidence, fix, caveat, stage=self.head.path, removes=removes)

    @property
    def cache_moves(self) -> str:
        """What else a cache right after this stage asks for: before a repeat below it, a shuffle below it after."""
        below = [s for s in self.pipeline.stages if st.under(s.path, self.head.path)]
        repeated = any("Repeat" in s.kind for s in below)
        shuffled = any("Shuffle" in s.kind for s in below)
        return (
            " (it reads a repeat(), so cache before the repeat: `ds.map(f).cache().repeat()` for "
            "`ds.repeat().map(f)`, the same elements in the same order)"
            if repeated
            else ""
        ) + (
            "; a shuffle below it would then replay the first epoch's order, so shuffle after the cache "
            "(`.cache().shuffle(n)`)"
            if shuffled
            else ""
        )

    @property
    def cache_line(self) -> str:
        element = st.element_bytes(self.head)
        return (
            "no random or Python op was recorded in it or in what a cache after it would keep (and it does not run "
            "after a cache), so `.cache()` right after it keeps its output and "
            "removes it from every epoch after the first"
            + self.below_note
            + self.cache_moves
            + (
                f" ({element / 1e6:.2f} MB per element in memory; `.cache(filename)` writes to disk instead)"
                if element
                else ""
            )
        )
