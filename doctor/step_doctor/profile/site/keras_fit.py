"""Keras `fit` under profile (part of capture.py's Capture): step markers and the capture window.

`fit` of Keras 3's TensorFlow trainer (and tf_keras's or Keras 2's Model, where installed) is wrapped
to add one callback, of the script's own Keras flavour, that wraps each step of the window in
`Trace("train", step_num=..., _r=1)` and starts and stops the profiler around the window. A profiling
callback the script passes itself would start a second session: its profiler is turned off for the
run and its steps become the window. Standard library only, like capture.py.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import time

DEFAULT_STEPS = (5, 16)  # the first steps trace, compile and fill autotuned buffers; 12 steps give a verdict
TRAINERS = {  # module -> the class whose `fit` is wrapped
    "keras.src.backend.tensorflow.trainer": "TensorFlowTrainer",  # Keras 3
    "keras.src.backend.jax.trainer": "JAXTrainer",  # Keras 3 with KERAS_BACKEND=jax (jax_capture.py)
    "tf_keras.src.engine.training": "Model",  # tf_keras (Keras 2 for TensorFlow 2.16+)
    "keras.src.engine.training": "Model",  # Keras 2.13-2.15
}


class FitCapture:
    """The Keras half of Capture (capture.py), which holds the state: window, step, session, begin() and end()."""

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
            theirs = callbacks if isinstance(callbacks, (list, tuple)) else getattr(callbacks, "callbacks", None) or []
            capture.status["callbacks"] = sorted({type(c).__name__ for c in theirs})  # prove refuses some
            own = capture.callback_class(package)()
            if callbacks is None or isinstance(callbacks, (list, tuple)):
                capture.take_over_profilers(list(callbacks or []), model)
                bound.arguments["callbacks"] = [*(callbacks or []), own]
            else:  # a CallbackList
                capture.take_over_profilers(list(getattr(callbacks, "callbacks", [])), model)
                callbacks.append(own)
            with capture.lock:
                capture.retake_for_fit()  # a plain-JAX-loop window already captured before this fit (jax_capture.py)
                capture.fit_used = True
            capture.keras_backend = "jax" if capture.jax_trainer(model) else "tensorflow"
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
                """Added by `step-doctor profile`: step markers and the capture window."""

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

    @staticmethod
    def jax_trainer(model) -> bool:
        """Whether this Keras model trains with Keras 3's JAX trainer (KERAS_BACKEND=jax)."""
        return any(cls.__module__ == "keras.src.backend.jax.trainer" for cls in type(model).__mro__)

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
            if self.session == "jax":
                self.trace = self.jax_step_marker(self.step)
            else:
                self.trace = self.tf.profiler.experimental.Trace("train", step_num=self.step, _r=1)
            self.trace.__enter__()

    def step_end(self, batch: int) -> None:
        with self.lock:
            if self.trace is not None:
                self.trace.__exit__(None, None, None)
                self.trace = None
        self.step += batch - self.first_batch + 1
