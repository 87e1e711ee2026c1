"""The capture inside a profiled process: step markers and the profiler, with no change to the user's code.

Loaded by this folder's sitecustomize.py in every Python process that `python -m train profile`
starts (its settings come in the GPU_TEMPLATE_PROFILE environment variable). It is self-contained
(standard library only; TensorFlow and Keras are used once the script imported them) because the
script may run in another environment than this project's, without the `train` package.

Nothing is imported up front: an import watcher waits for the script's own `import tensorflow`
(and Keras), then patches, in memory only:
- Keras `fit` (Keras 3's TensorFlow trainer; tf_keras and Keras 2 where installed) gets one more
  callback, which wraps each step of the capture window in `Trace("train", step_num=..., _r=1)`
  (step markers xprof understands, openxla/xprof#578) and starts and stops the profiler around
  that window. A profiling callback the script passes itself (keras TensorBoard with
  profile_batch, this project's StepTraceProfiler) would start a second profiler session, which
  TensorFlow refuses: its profiler is turned off for the run and its steps become the window.
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
import inspect
import json
import os
import sys
import threading
import time

ENV = "GPU_TEMPLATE_PROFILE"
DEFAULT_STEPS = (5, 16)  # the first steps trace, compile and fill autotuned buffers; 12 steps give a verdict
# A custom loop without --seconds: 2 s, extended to 12 steps (at most 60 s), cut at 50 steps (a fast loop's trace
# grows with every step, and xprof's conversion with it).
AUTO_SECONDS, AUTO_MIN_CALLS, AUTO_MAX_CALLS, AUTO_MAX_SECONDS = 2.0, 12, 50, 60.0
TRAINERS = {  # module -> the class whose `fit` is wrapped
    "keras.src.backend.tensorflow.trainer": "TensorFlowTrainer",  # Keras 3
    "tf_keras.src.engine.training": "Model",  # tf_keras (Keras 2 for TensorFlow 2.16+)
    "keras.src.engine.training": "Model",  # Keras 2.13-2.15
}
FUNCTIONS = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
PROFILER_APIS = (
    "tensorflow.python.profiler.profiler_v2",
    "tensorflow._api.v2.profiler.experimental",
    "tensorflow._api.v2.compat.v2.profiler.experimental",
)


class _Watcher:
    """A meta path finder that runs a hook once a watched module has been executed."""

    def __init__(self, hooks: dict):
        self.hooks = hooks

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
        hook, execute = self.hooks.pop(name), loader.exec_module

        def exec_module(module):
            execute(module)
            hook(module)

        loader.exec_module = exec_module
        return spec


class Capture:
    """One per process: the window, the profiler session, and the status file."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.pid = os.getpid()
        self.steps = tuple(settings["steps"]) if settings.get("steps") else None
        self.seconds = settings.get("seconds")
        self.window = self.steps or DEFAULT_STEPS
        self.window_from = "--steps" if self.steps else "default"
        self.tf = None
        self.start_profiler = None
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
        }

    # ---- status ----------------------------------------------------------------------------------

    def save(self) -> None:
        if os.getpid() != self.pid:
            return
        self.status["argv"] = list(sys.argv)
        self.status["steps_seen"] = self.step if self.fit_used else self.calls.get(self.loop_function, 0)
        if self.calls:
            name = max(self.calls, key=self.calls.get)
            self.status["most_called"] = {"function": name, "calls": self.calls[name]}
        path = os.path.join(self.settings["status_dir"], f"{self.pid}.json")
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as out:
                json.dump(self.status, out)
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
        try:
            self.start_profiler(self.run_dir())
        except Exception as error:  # the script's own session runs, or the profiler failed
            other = type(error).__name__ == "AlreadyExistsError"
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
        self.status["capture"] = {"state": "active", "at": where, "started_at": time.time()}
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
            capture.update(state="done", stopped_at=time.time(), why=why, last_step=self.status_steps())
            try:
                self.tf.profiler.experimental.stop()
            except Exception as error:
                capture.update(state="failed", error=f"{type(error).__name__}: {error}")
            self.save()

    def status_steps(self) -> int:
        return self.step - 1 if self.fit_used else self.calls.get(self.loop_function, 0) - 1

    # ---- hooks installed when the script imports TensorFlow and Keras -----------------------------

    def on_tensorflow(self, module) -> None:
        self.tf = module
        self.status["tensorflow_at"] = time.time()
        atexit.register(self.at_exit)  # registered after TensorFlow's own, so it runs before them
        functions = sys.modules.get(FUNCTIONS)
        if functions is not None:
            self._wrap_calls(functions.Function)
        self._wrap_profiler_start()
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

    def on_trainer(self, module, class_name: str) -> None:
        cls = getattr(module, class_name, None)
        if cls is None:
            return
        for method in ("evaluate", "predict"):  # their tf.function calls are not a custom loop's steps
            if hasattr(cls, method):
                setattr(cls, method, self._inside_keras(getattr(cls, method)))
        if hasattr(cls, "fit"):
            cls.fit = self._wrap_fit(cls.fit, module.__name__.split(".")[0])

    def _inside_keras(self, method):
        capture = self

        def inside(*args, **kwargs):
            capture.in_keras += 1
            try:
                return method(*args, **kwargs)
            finally:
                capture.in_keras -= 1

        inside.__wrapped__ = method
        return inside

    def _wrap_fit(self, fit, package: str):
        signature = inspect.signature(fit)
        capture = self

        def fit_with_capture(model, *args, **kwargs):
            try:
                bound = signature.bind(model, *args, **kwargs)
            except TypeError:
                return fit(model, *args, **kwargs)  # let Keras say what is wrong
            callbacks = bound.arguments.get("callbacks")
            own = capture.callback_class(package)()
            if callbacks is None or isinstance(callbacks, (list, tuple)):
                capture.take_over_profilers(list(callbacks or []), model)
                bound.arguments["callbacks"] = [*(callbacks or []), own]
            else:  # a CallbackList
                capture.take_over_profilers(list(getattr(callbacks, "callbacks", [])), model)
                callbacks.append(own)
            capture.fit_used = True
            capture.status["mode"] = "keras-fit"
            capture.in_keras += 1
            capture.fitting += 1
            try:
                history = fit(*bound.args, **bound.kwargs)
            except BaseException:
                capture.end("Keras fit raised")  # an error or Ctrl-C: keep what was captured
                raise
            finally:
                capture.in_keras -= 1
                capture.fitting -= 1
                capture.save()
            if capture.state == "active" and not capture.watching:  # the window may go on in the next fit call
                capture.watching = True
                threading.Thread(target=capture.watch_fit, name="profile-window", daemon=True).start()
            return history

        fit_with_capture.__wrapped__ = fit
        return fit_with_capture

    # ---- Keras fit steps ---------------------------------------------------------------------------

    def callback_class(self, package: str):
        """A Callback subclass of the script's Keras flavour (tf_keras's CallbackList needs its own base)."""
        if package not in self.callback_classes:
            base = importlib.import_module(f"{package}.callbacks").Callback
            capture = self

            class ProfileSteps(base):
                """Added by `python -m train profile`: step markers and the capture window."""

                def on_train_begin(self, logs=None):
                    params = getattr(self, "params", None) or {}
                    steps, epochs = params.get("steps"), params.get("epochs")
                    capture.fit_begin(steps * epochs if steps and epochs else None)

                def on_train_batch_begin(self, batch, logs=None):
                    capture.step_begin(batch)

                def on_train_batch_end(self, batch, logs=None):
                    capture.step_end(batch)

            self.callback_classes[package] = ProfileSteps
        return self.callback_classes[package]

    def take_over_profilers(self, callbacks: list, model) -> None:
        """Turn off the profiler of a callback that would start a second session; its steps become the window."""
        spe = getattr(model, "steps_per_execution", None) or getattr(model, "_steps_per_execution", None) or 1
        try:
            spe = max(1, int(spe.numpy() if hasattr(spe, "numpy") else spe))
        except (TypeError, ValueError):
            spe = 1
        for callback in callbacks:
            if getattr(callback, "_should_trace", False) and hasattr(callback, "_start_batch"):  # keras TensorBoard
                first, last = callback._start_batch, callback._stop_batch  # 1-based executions of this fit
                callback._should_trace = False
                theirs = (self.step + (first - 1) * spe, self.step + last * spe - 1)
                described = f"keras.callbacks.TensorBoard(profile_batch=({first}, {last}))"
            elif type(callback).__name__ == "StepTraceProfiler" and getattr(callback, "_state", None) == "waiting":
                callback._state = "done"
                first = self.step + callback.start_step
                theirs = (first, first + callback.num_steps + 1)
                described = f"StepTraceProfiler(start_step={callback.start_step}, num_steps={callback.num_steps})"
            else:
                continue
            if self.state == "waiting" and self.window_from != "--steps":
                self.window = (theirs[0], max(theirs[1], theirs[0] + DEFAULT_STEPS[1] - DEFAULT_STEPS[0]))
                self.window_from = described
                kept = f"over your steps {self.window[0]}-{self.window[1]}"
            else:
                kept = f"over steps {self.window[0]}-{self.window[1]} (--steps)"
            self.note(
                f"Your {described} would start a second profiler session, which TensorFlow refuses "
                "('Only one active profiler session is allowed'): profile kept one session, its own, "
                f"{kept}, with step markers, and turned your callback's profiler off for this run (its other logs "
                "are written as usual)."
            )

    def fit_begin(self, remaining: int | None) -> None:
        """Move the default window into a short fit (`remaining` steps, when Keras knows them)."""
        if self.state != "waiting" or self.window_from != "default" or not remaining:
            return
        last = self.step + remaining - 1
        if last < self.window[1]:
            first = max(self.step + 1, last - (DEFAULT_STEPS[1] - DEFAULT_STEPS[0]))
            if last - first >= 2:
                self.window = (first, last)

    def watch_fit(self, idle_s: float = 10.0) -> None:
        """After a fit returned inside the window: end the capture when no further fit step comes."""
        while self.state == "active":
            if not self.fitting and time.time() - self.last_step_at > idle_s:
                self.end(f"no Keras step for {idle_s:g} s after fit returned")
            time.sleep(0.25)
        self.watching = False

    def step_begin(self, batch: int) -> None:
        self.first_batch = batch
        self.last_step_at = time.time()
        if self.state == "active" and self.step > self.window[1]:
            self.end(f"the window ended after step {self.window[1]}")
        if self.state == "waiting" and self.step >= self.window[0]:
            self.status["window"] = {"steps": list(self.window), "from": self.window_from}
            self.begin(f"step {self.step}")
        if self.state == "active":
            self.trace = self.tf.profiler.experimental.Trace("train", step_num=self.step, _r=1)
            self.trace.__enter__()

    def step_end(self, batch: int) -> None:
        with self.lock:
            if self.trace is not None:
                self.trace.__exit__(None, None, None)
                self.trace = None
        self.step += batch - self.first_batch + 1

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

    def at_exit(self) -> None:
        self.end("the process exited")
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
    hooks = {"tensorflow": capture.on_tensorflow}
    for module, class_name in TRAINERS.items():
        hooks[module] = lambda loaded, class_name=class_name: capture.on_trainer(loaded, class_name)
    sys.meta_path.insert(0, _Watcher({name: _guarded(capture, hook) for name, hook in hooks.items()}))
    os.register_at_fork(after_in_child=lambda: setattr(capture, "pid", -1))  # a forked child captures nothing
    capture.save()
    return capture
