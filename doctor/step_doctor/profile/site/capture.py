"""The capture inside a profiled process: step markers and the profiler, with no change to the user's code.

Loaded by this folder's sitecustomize.py in every Python process that `step-doctor profile`
starts (its settings come in the STEP_DOCTOR_PROFILE environment variable). It is self-contained
(standard library only; TensorFlow and Keras are used once the script imported them) because the
script may run in another environment than this project's, without the `train` package.

Nothing is imported up front: an import watcher waits for the script's own `import tensorflow`
(and Keras), then patches, in memory only:
- Keras `fit` (keras_fit.py): step markers (`Trace("train", step_num=..., _r=1)`, which xprof
  understands, openxla/xprof#578) and the profiler over a window of steps; a profiling callback the
  script passes itself is turned off for the run, its steps becoming the window (one session).
- `tf.function` calls: a custom training loop (no `fit`) is captured over a time window that
  starts once one function has run `start` times eagerly; the analyser infers the steps from
  that function's executions.
- `tf.profiler.experimental.start`: when the script starts its own session while ours runs, ours
  stops first (what it captured is kept), so the script never fails on our account.

What happened is written, atomically, to <status_dir>/<pid>.json for the parent to report.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import sys
import threading
import time


def _sibling(name: str, folder: str = "."):
    """A module of this folder (or of `folder` relative to it), which is a sys.path entry in the child, not a package:
    loaded by its path."""
    private = f"_step_doctor_profile_{name}"
    if private not in sys.modules:
        where = os.path.join(os.path.dirname(__file__), folder, f"{name}.py")
        spec = importlib.util.spec_from_file_location(private, where)
        module = importlib.util.module_from_spec(spec)
        sys.modules[private] = module
        spec.loader.exec_module(module)
    return sys.modules[private]


keras_fit = _sibling("keras_fit")
jax_capture = _sibling("jax_capture")
consume_fix = _sibling("consume_fix")
dataset_sources = _sibling("dataset_sources")
fixes = _sibling("fixes")
process_cpu = _sibling("process_cpu", "../..")  # step_doctor/process_cpu.py, shared with callbacks.py
DEFAULT_STEPS, TRAINERS = keras_fit.DEFAULT_STEPS, keras_fit.TRAINERS

ENV = "STEP_DOCTOR_PROFILE"
# A custom loop without --seconds: 2 s, extended to 12 steps (at most 60 s), cut at 50 steps (a fast loop's trace
# grows with every step, and xprof's conversion with it). A worker of several (TF_CONFIG) captures exactly 12
# steps instead, so that every worker captures the same ones whatever its clock says.
AUTO_SECONDS, AUTO_MIN_CALLS, AUTO_MAX_CALLS, AUTO_MAX_SECONDS = 2.0, 12, 50, 60.0
FUNCTIONS = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
PROFILER_APIS = (
    "tensorflow.python.profiler.profiler_v2",
    "tensorflow._api.v2.profiler.experimental",
    "tensorflow._api.v2.compat.v2.profiler.experimental",
)


class _Watcher:
    """A meta path finder that runs a hook once a watched module has been executed."""

    def __init__(self, hooks: dict, before: dict | None = None):
        self.hooks = hooks
        self.before = before or {}  # hooks that run before the module's own code (the fix must precede TensorFlow)

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(name, path, target)
            except Exception:  # the import system asks that finder again after us and reports it as usual
                return None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        hook, before, execute = self.hooks.pop(name), self.before.pop(name, None), loader.exec_module

        def exec_module(module):
            if before is not None:
                before(module)
            execute(module)
            hook(module)

        loader.exec_module = exec_module
        return spec


class Capture(keras_fit.FitCapture, jax_capture.JaxCapture):
    """One per process: the window, the profiler session, and the status file."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.pid = os.getpid()
        self.steps = tuple(settings["steps"]) if settings.get("steps") else None
        self.seconds = settings.get("seconds")
        self.window = self.steps or DEFAULT_STEPS
        self.window_from = "--steps" if self.steps else "default"
        self.tf = self.jax = None
        self.start_profiler = None
        self.session = None  # whose profiler the window runs: "tensorflow" or "jax"
        self.exit_registered = False
        self.compiles = []
        self.state = "waiting"  # waiting -> active -> done | skipped | failed
        self.in_keras = 0
        self.fit_used = False
        self.step = 0  # Keras fit steps so far, across fit calls
        self.last_step_at = 0.0
        self.fitting = 0
        self.watching = False
        self.first_batch = 0
        self.trace = None
        self.calls: dict = {}  # tf.function name -> eager calls outside Keras
        self.loop_function = None
        self.call_times: list = []
        self.lock = threading.RLock()
        self.callback_classes: dict = {}
        self.sources = dataset_sources.Sources(count=bool(settings.get("prove")))
        self.cpu = process_cpu.Window()  # the process CPU of the window, for the estimates
        self.trial = settings.get("trial")  # a trial of `profile --prove`: time the window with fixes applied, exit
        self.fixes = None
        self.status = {
            "pid": self.pid,
            "argv": list(sys.argv),
            "started_at": time.time(),
            "run": None,
            "tensorflow_at": None,
            "mode": None,
            "steps_seen": 0,
            "window": None,
            "capture": None,
            "most_called": None,
            "notes": [],
            "consume_fix": None,
        }
        self.multi_worker = False  # decided when the script imports TensorFlow: it may set TF_CONFIG itself before

    # ---- status ----------------------------------------------------------------------------------

    def save(self) -> None:
        if os.getpid() != self.pid:
            return
        self.status["argv"] = list(sys.argv)
        self.status["steps_seen"] = self.step if self.fit_used else self.calls.get(self.loop_function, 0)
        self.status["pass_steps"] = self.sources.pass_steps
        if self.calls:
            name = max(self.calls, key=self.calls.get)
            self.status["most_called"] = {"function": name, "calls": self.calls[name]}
        path = os.path.join(self.settings["status_dir"], f"{self.pid}.json")
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as out:
                json.dump(self.status, out, default=str)  # never fail the script over a figure
            os.replace(tmp, path)
        except OSError:
            pass  # the status folder is gone: the parent no longer waits for it

    def note(self, text: str) -> None:
        self.status["notes"].append(text)
        self.save()

    def run_dir(self) -> str:
        """<logdir>/<script> for the command's own process, <logdir>/<type>-<index> for a TF_CONFIG worker, else
        <logdir>/pid-N: one TensorBoard run per process."""
        try:
            config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        except ValueError:
            config = {}
        task, cluster = config.get("task") or {}, config.get("cluster") or {}
        if task and sum(len(v) for v in cluster.values() if isinstance(v, list)) > 1:
            run = f"{task.get('type', 'worker')}-{task.get('index', 0)}"
        elif os.getppid() == self.settings.get("parent"):
            run = self.settings.get("name") or "main"
        else:
            run = f"pid-{self.pid}"
        self.status["run"] = run
        return os.path.normpath(os.path.join(self.settings["logdir"], run))

    # ---- the profiler session --------------------------------------------------------------------

    def begin(self, where: str) -> None:
        if os.getpid() != self.pid:
            return
        if self.trial:
            self.state, self.session = "active", "trial"
            self.status["capture"] = {"state": "active", "at": where, "started_at": time.time(), "profiler": None}
            self.save()
            return
        run_dir = self.run_dir()  # named in the status even where nothing is captured
        if consume_fix.is_multi_worker() and not self.multi_worker:  # TF_CONFIG was set after `import tensorflow`
            self.multi_worker = True
            self.status["consume_fix"] = {
                "loaded": False,
                "safe": False,
                "check": "import-order",
                "library": None,
                "binary": None,
                "why": "TF_CONFIG was set after the script imported TensorFlow, and the fix must be loaded before it",
            }
        fix = self.status["consume_fix"]
        if self.multi_worker and not (fix and fix["safe"]) and not self.settings.get("unsafe_multi_worker"):
            self.state = "skipped"
            fix = fix or {"check": "load", "why": "loading it failed (see the notes above)"}
            self.status["capture"] = {"state": "skipped", "at": where, "error": f"no fix: {fix['why']}"}
            self.note(
                "Not captured: this is one of several MultiWorkerMirroredStrategy workers, where TensorFlow's "
                f"profiler can crash the process when it stops, and the fix against it is not in effect here: "
                f"{consume_fix.refusal(fix)} `step-doctor profile --unsafe-multi-worker` captures it anyway, at that "
                "risk."
            )
            return
        try:
            if self.uses_jax():
                self.start_jax(run_dir)
                self.session = "jax"
            else:
                self.start_profiler(run_dir)
                self.session = "tensorflow"
        except Exception as error:  # the script's own session runs, or the profiler failed
            other = type(error).__name__ == "AlreadyExistsError" or "already" in str(error).lower()
            self.state = "skipped" if other else "failed"
            self.status["capture"] = {"state": self.state, "at": where, "error": f"{type(error).__name__}: {error}"}
            if other:
                self.note(
                    f"Your script's own profiler session was running at {where}, when profile's window began: "
                    "TensorFlow allows one session at a time, so profile captured nothing itself."
                )
            self.save()
            return
        self.state = "active"
        self.cpu.start()
        self.status["capture"] = {"state": "active", "at": where, "started_at": time.time(), "profiler": self.session}
        self.save()

    def end(self, why: str) -> None:
        with self.lock:
            if self.state != "active":
                return
            self.state = "done"
            if self.trace is not None:
                self.trace.__exit__(None, None, None)
                self.trace = None
            capture = self.status["capture"]
            if self.session == "trial":
                return self.end_trial(capture, why)
            self.cpu.stop()
            capture.update(state="stopping", stopped_at=time.time(), why=why, last_step=self.status_steps())
            # Saved first: a process that dies inside TensorFlow's stop (TensorFlow's crash under
            # MultiWorkerMirroredStrategy where its fix is not loaded: consume_fix.py) leaves "stopping" behind, which
            # the parent reports as such.
            self.save()
            try:
                if self.session == "jax":
                    self.stop_jax(os.path.join(self.settings["logdir"], self.status["run"]))
                else:
                    self.tf.profiler.experimental.stop()
                capture.update(state="done")
                self.drop_superseded()
            except Exception as error:
                capture.update(state="failed", error=f"{type(error).__name__}: {error}")
            self.save()
            self.write_sources()

    def end_trial(self, capture: dict, why: str) -> None:
        """A trial's window is timed: say how long it took and what was applied, and end the process there (what the
        script would do after the window is not measured, and a trial must not run the whole training)."""
        now = time.time()
        first, last = self.window if self.fit_used else self.steps or self.window
        done = self.status_steps()
        self.status["trial"] = {
            "seconds": now - capture["started_at"],
            "steps": min(done, last) - first + 1,
            "complete": done >= last,
            "fixes": self.fixes.report() if self.fixes else [],
        }
        capture.update(state="done", stopped_at=now, why=why, last_step=done)
        self.save()
        if why != "the process exited":
            os._exit(0)

    def write_sources(self) -> None:
        """The lines that built the datasets and the window's process CPU, beside the profile (a run that captured
        nothing needs none)."""
        if os.getpid() == self.pid and self.status["capture"] and self.status["capture"].get("state") == "done":
            run_dir = os.path.join(self.settings["logdir"], self.status["run"])
            self.sources.write(run_dir)
            self.cpu.write(run_dir)

    def status_steps(self) -> int:
        return self.step - 1 if self.fit_used else self.calls.get(self.loop_function, 0) - 1

    # ---- hooks installed when the script imports TensorFlow and Keras -----------------------------

    def before_tensorflow(self, module) -> None:
        """Load the fix for TensorFlow's crash in stop() where this process is a worker of several (consume_fix.py)."""
        if consume_fix.is_multi_worker():
            self.multi_worker = True
            self.status["consume_fix"] = consume_fix.load()
            self.save()

    def on_tensorflow(self, module) -> None:
        self.tf = module
        self.status["tensorflow_at"] = time.time()
        self.register_exit()
        functions = sys.modules.get(FUNCTIONS)
        if functions is not None:
            self._wrap_calls(functions.Function)
        self._wrap_profiler_start()
        try:
            self.sources.install(module)
            if self.trial:
                self.fixes = fixes.Fixes(self.trial.get("fixes") or [], self.sources.caller, self.note, dataset_sources)
                self.fixes.install(module)
        except Exception as error:
            self.note(f"profile could not record where the datasets were built ({type(error).__name__}: {error}).")
        self.save()

    def _wrap_calls(self, cls) -> None:
        call = cls.__call__
        eager = importlib.import_module("tensorflow.python.eager.context").executing_eagerly
        capture = self

        def __call__(function, *args, **kwargs):
            if not capture.in_keras and capture.state in ("waiting", "active") and eager():
                capture.on_call(function)
            return call(function, *args, **kwargs)

        __call__.__wrapped__ = call
        cls.__call__ = __call__

    def _wrap_profiler_start(self) -> None:
        api = sys.modules.get(PROFILER_APIS[0])
        if api is None:
            return
        self.start_profiler = original = api.start
        capture = self

        def start(*args, **kwargs):
            if capture.state == "active":
                where = f"step {capture.step}" if capture.fit_used else "a custom loop"
                capture.end("the script started its own profiler session")
                capture.note(
                    f"Your script started its own profiler session ({where}) while profile's capture ran: "
                    "TensorFlow allows one session at a time, so profile stopped its own there and kept what it had."
                )
            return original(*args, **kwargs)

        for name in PROFILER_APIS:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "start", None) is original:
                module.start = start

    # ---- custom loops: tf.function calls outside Keras ---------------------------------------------

    def on_call(self, function) -> None:
        if os.getpid() != self.pid or self.fit_used:
            return
        name = getattr(function, "_name", None) or getattr(function, "__name__", "tf.function")
        count = self.calls.get(name, 0)
        self.calls[name] = count + 1
        first = self.steps[0] if self.steps else DEFAULT_STEPS[0]
        if self.state == "waiting" and count >= first:
            self.loop_function = name
            self.status["mode"] = "custom-loop"
            self.status["window"] = {"function": name, "from_call": count, "seconds": self.seconds}
            if self.steps:
                self.status["window"]["steps"] = list(self.steps)
            self.call_times = []
            self.begin(f"call {count} of {name}")
            if self.state == "active":
                threading.Thread(target=self._watch_loop, name="profile-window", daemon=True).start()
        if self.state == "active" and name == self.loop_function:
            now = time.time()
            if self._loop_done(count, now):
                self.end(f"the window ended before call {count} of {name}")
            else:
                self.call_times.append(now)

    def _loop_done(self, count: int, now: float) -> bool:
        elapsed = now - self.status["capture"]["started_at"]
        if self.steps:
            return count > self.steps[1]
        if self.seconds:
            return elapsed >= self.seconds
        calls = len(self.call_times)
        if self.multi_worker:
            return calls >= AUTO_MIN_CALLS
        return (
            (elapsed >= AUTO_SECONDS and calls >= AUTO_MIN_CALLS)
            or calls >= AUTO_MAX_CALLS
            or elapsed >= AUTO_MAX_SECONDS
        )

    def _watch_loop(self) -> None:
        """End the capture when the loop stalls or has ended (the script went on to something else), so the
        profile does not run on to the end of the process."""
        limit = 2 * (self.seconds or AUTO_MAX_SECONDS) + 10
        while self.state == "active":
            time.sleep(0.25)
            times, now = list(self.call_times), time.time()
            started = self.status["capture"].get("started_at", now)
            gaps = sorted(b - a for a, b in zip(times, times[1:])) or [1.0]
            quiet = now - (times[-1] if times else started)
            if (len(times) >= 3 and quiet > max(2.0, 5 * gaps[len(gaps) // 2])) or now - started > limit:
                self.end("the step function was not called for a while (the loop ended or stalled)")

    def register_exit(self) -> None:
        """Registered after TensorFlow's (or JAX's) own exit handlers, so it runs before them."""
        if not self.exit_registered:
            atexit.register(self.at_exit)
            self.exit_registered = True

    def at_exit(self) -> None:
        self.end("the process exited")
        self.keep_loop_capture()
        self.write_sources()  # again: datasets built after the window are kept too
        self.save()


def _guarded(capture: Capture, hook):
    """A hook that never breaks the script's import: a failure is reported, and that part is not captured."""

    def run(module):
        try:
            hook(module)
        except Exception as error:
            capture.note(f"profile could not hook into {module.__name__} ({type(error).__name__}: {error}).")

    return run


def install() -> Capture | None:
    """Called by sitecustomize.py: watch for TensorFlow and Keras when profile's settings are in the environment."""
    try:
        settings = json.loads(os.environ.get(ENV) or "null")
    except ValueError:
        return None
    if not isinstance(settings, dict):
        return None
    capture = Capture(settings)
    hooks = {"tensorflow": capture.on_tensorflow, "jax": capture.on_jax}
    for module, class_name in TRAINERS.items():
        hooks[module] = lambda loaded, class_name=class_name: capture.on_trainer(loaded, class_name)
    before = {"tensorflow": _guarded(capture, capture.before_tensorflow)}
    sys.meta_path.insert(0, _Watcher({name: _guarded(capture, hook) for name, hook in hooks.items()}, before))
    os.register_at_fork(after_in_child=lambda: setattr(capture, "pid", -1))  # a forked child captures nothing
    capture.save()
    return capture
