"""The parent of `step-doctor profile`: run the command with the capture injected, sample around it.

The command runs as a child with its own arguments, working directory, environment (plus two
entries), stdin, stdout and exit status. The parent imports no TensorFlow: it samples NVML, GPM
and host CPU over the whole run (sampler.py) into <logdir>/utilization as
TensorBoard scalars, forwards the signals it receives, and collects what each Python process of
the command reported (site/capture.py writes one status file per process).

Signals: the parent blocks SIGINT and SIGTERM before it starts any thread (cli.py, before numpy's BLAS
starts one; every later thread, the sampler's too, inherits the mask; the command starts with them
unblocked) and takes them with sigtimedwait in its main loop, which also wakes it each second to
write samples (a thread started before the block would take the signal in place of the loop). A
Ctrl-C typed at the terminal reaches the child directly (same process group; the kernel marks it
SI_KERNEL) and is not sent twice; a signal sent to the parent alone (kill, a supervisor) is forwarded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from step_doctor.errors import UserError
from step_doctor.sampler import Sampler, SampleWriter

SITE = Path(__file__).resolve().parent / "site"
ENV = "STEP_DOCTOR_PROFILE"  # site/capture.py reads its settings here
SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel sent: the terminal's Ctrl-C
FORWARDED = (signal.SIGINT, signal.SIGTERM)


@dataclass
class ChildRun:
    command: list[str]
    returncode: int
    seconds: float
    started: float
    signals: list[str] = field(default_factory=list)  # what the parent received and forwarded
    statuses: list[dict] = field(default_factory=list)  # one per Python process that loaded the hook

    @property
    def exit_status(self) -> int:
        """The child's status as a shell reports it: 128 + N for a death by signal N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"


def parse_steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, _, last = text.partition("-")
    try:
        window = (int(first), int(last))
    except ValueError:
        window = None
    if window is None or window[0] < 0 or window[1] - window[0] < 2:
        raise UserError(
            f"--steps {text}: give the first and last step to capture as A-B, counted from 0, at least three steps "
            "apart ends included (the first is left out of the figures: the profiler starts inside it), e.g. "
            "--steps 5-16."
        )
    return window


def script_name(command: list[str]) -> str:
    """What the command runs, as a TensorBoard run name: my_train (python my_train.py), train (python -m train)."""
    for index, arg in enumerate(command):
        if arg.endswith(".py"):
            name = Path(arg).stem
            return name if name != "__main__" else Path(arg).parent.name
        if arg == "-m" and index + 1 < len(command):
            return command[index + 1].split(".")[0]
    return Path(command[0]).name or "command"


def default_logdir(command: list[str]) -> Path:
    return Path("runs") / "profile" / f"{script_name(command)}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_logdir(logdir: Path) -> Path:
    """A new or empty folder: a profile of an earlier run in it would be diagnosed with this one.
    A run that captures nothing leaves nothing there (discard)."""
    if logdir.exists() and (not logdir.is_dir() or any(logdir.iterdir())):
        raise UserError(
            f"--logdir {logdir} already holds files: a profile left there by an earlier run would be diagnosed with "
            "this one. Choose a new folder (without --logdir, profile makes runs/profile/<script>-<time>) or remove "
            "it."
        )
    logdir = logdir.resolve()
    missing = [folder for folder in (logdir, *logdir.parents) if not folder.exists()]
    logdir.mkdir(parents=True, exist_ok=True)
    _CREATED[logdir] = missing[-1] if missing else None
    return logdir


_CREATED: dict = {}  # log folder -> the outermost folder prepare_logdir created for it


def discard(logdir: Path) -> None:
    """Remove what a run that captured nothing wrote: its utilization, and the empty folders made for it."""
    shutil.rmtree(logdir / "utilization", ignore_errors=True)
    for folder in sorted((p for p in logdir.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    created = _CREATED.get(logdir)
    for folder in (logdir, *logdir.parents):
        if created is None or not folder.is_dir() or any(folder.iterdir()):
            break
        folder.rmdir()
        if folder == created:
            break


def child_env(
    logdir: Path, status_dir: str, steps, seconds, name: str, unsafe_multi_worker: bool = False, prove: bool = False
) -> dict:
    env = dict(os.environ)
    paths = [str(SITE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    settings = {"logdir": str(logdir), "status_dir": status_dir, "steps": steps, "seconds": seconds, "name": name}
    settings["unsafe_multi_worker"] = unsafe_multi_worker
    settings["prove"] = prove  # prove follows: count one pass over the data where tf.data cannot (its window)
    env[ENV] = json.dumps({**settings, "parent": os.getpid()})
    return env


def run(
    command: list[str],
    logdir: Path,
    steps,
    seconds,
    json_mode: bool,
    name: str,
    interval_s: float = 0.5,
    unsafe_multi_worker: bool = False,
    prove: bool = False,
):
    """Run the command to its end; returns (ChildRun, sampler) with the samples written under logdir/utilization.

    The command's own process profiles into logdir/<name>, a TF_CONFIG worker into logdir/<type>-<index>,
    any other Python process it starts into logdir/pid-<pid>: one TensorBoard run, and one verdict, each."""
    status_dir = tempfile.mkdtemp(prefix="step-doctor-profile-")
    try:
        env = child_env(logdir, status_dir, steps, seconds, name, unsafe_multi_worker, prove)
        started = time.time()
        try:
            with _unblocked() as early:  # the command gets the signal mask it would have without profile
                child = subprocess.Popen(command, env=env, stdout=sys.stderr.fileno() if json_mode else None)
        except OSError as error:
            discard(logdir)
            raise UserError(
                f"Could not start `{command[0]}`: {error.strerror or error}. Give the command as you would run it "
                "yourself, after --, e.g. step-doctor profile -- python my_train.py --epochs 3."
            ) from None
        for signum in early:  # taken while the command started: it gets them now
            child.send_signal(signum)
        received = _watch(child, logdir, interval_s, [signal.Signals(signum).name for signum in early])
        returncode = child.wait()
        result = ChildRun(command, returncode, time.time() - started, started, signals=received[0])
        result.statuses = _statuses(status_dir)
        return result, received[1]
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)


@contextlib.contextmanager
def _unblocked():
    """The forwarded signals unblocked in this thread while the block runs (a child started here inherits its mask),
    as they were after it; one that arrives meanwhile is kept in the list it yields, for the caller to forward."""
    early: list[int] = []
    handlers = {signum: signal.signal(signum, lambda got, _frame: early.append(got)) for signum in FORWARDED}
    before = signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    try:
        yield early
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _watch(child: subprocess.Popen, logdir: Path, interval_s: float, received: list[str]) -> tuple[list[str], Sampler]:
    """Wait for the child with the signals blocked, sampling; forward what only the parent received (`received`: what
    it already forwarded)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    sampler = Sampler(interval_s)
    writer = SampleWriter(logdir / "utilization")
    sampler.start()
    try:
        while child.poll() is None:
            info = signal.sigtimedwait(FORWARDED, 1.0)
            if info is not None:
                received.append(signal.Signals(info.si_signo).name)
                if not (info.si_signo == signal.SIGINT and info.si_code == SI_KERNEL):
                    child.send_signal(info.si_signo)  # a terminal's Ctrl-C already reached the whole group
            writer.write(sampler.samples)
    finally:
        sampler.stop()
        writer.write(sampler.samples)
        writer.close()
        while signal.sigtimedwait(FORWARDED, 0) is not None:  # drained: the child has ended
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    return received, sampler


def _statuses(status_dir: str) -> list[dict]:
    found = []
    for path in sorted(Path(status_dir).glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # written atomically: a file that does not parse was never complete
    return sorted(found, key=lambda s: s.get("started_at", 0))


def hand_back(paths: list[Path], owner: str, since: float) -> None:
    """Give the files this run wrote as root to `owner` (UID:GID): the Docker profiling service runs as root."""
    try:
        uid, gid = (int(part) for part in owner.split(":"))
    except ValueError:
        raise UserError(f"--chown {owner}: give UID:GID as numbers, e.g. --chown 1000:1000.") from None
    for root in paths:
        for folder, dirs, names in os.walk(root):
            for name in [*dirs, *names, None]:
                path = os.path.join(folder, name) if name else folder
                try:
                    info = os.lstat(path)
                    if info.st_uid == 0 and info.st_mtime >= since - 1:
                        os.lchown(path, uid, gid)
                except OSError:
                    continue
