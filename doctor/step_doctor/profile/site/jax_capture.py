"""JAX under profile (part of capture.py's Capture): JAX's profiler, its step markers, and a custom loop's window.

A script that trains with JAX (Keras 3 with KERAS_BACKEND=jax, or a plain JAX/Flax loop) is captured with
`jax.profiler`, which writes the same XSpace profile TensorFlow's profiler writes, with XLA's execution and, on a
GPU, the device planes. Where the script also imported TensorFlow (a tf.data input pipeline), TensorFlow's profiler
runs over the same window: tf.data's stages are recorded only by TensorFlow's own recorder. Its file is moved into
JAX's session folder as `<host>-tensorflow.xplane.pb`, and `diagnose` lays the two on one clock (each file carries
its absolute start time).

- Keras `fit` on the JAX backend: keras_fit.py's callback marks each step with `jax.profiler.StepTraceAnnotation`
  (the JAX trainer fetches a batch before its step's callback, so a step's input wait falls before its marker:
  `diagnose` counts a JAX step from one marker's start to the next).
- A plain JAX loop (no `fit`): nothing in Python sees a jitted function's calls (JAX runs them in C++), so the
  window is time-based: it starts once JAX has compiled and `START_AFTER_S` have passed without a compile (or
  `SETTLE_MAX_S` after the first, for a loop that compiles every step), and lasts `--seconds` (2 s by default);
  `diagnose` infers the steps from the jitted step's executions. JAX's compiles can come from Keras building a
  model too, and a script may then make its data for longer than that quiet before it calls `fit`: a Keras `fit`
  that begins inside the window takes it over (its steps are marked and end it), and one that begins after it
  captures its own window, which replaces the plain-loop one once it has been captured (`retake_for_fit`). Under
  `profile --prove`, a trial of a script profiled as Keras fit opens no plain-loop window.

Standard library only, like capture.py; JAX is used once the script imported it.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
import time

START_AFTER_S = 1.0  # quiet after the last compile before a loop's window starts ...
SETTLE_MAX_S = 10.0  # ... or this long after the first compile, whichever comes first
LOOP_SECONDS = 2.0  # a plain JAX loop's window without --seconds
COMPILED = "backend_compile_duration"  # the suffix of JAX's monitoring event for one XLA compile


class JaxCapture:
    """The JAX half of Capture (capture.py), which holds the state: window, session, begin() and end()."""

    jax = None
    keras_backend = None
    compiles: list
    tf_side: str | None = None
    last_session: str | None = None  # the session folder JAX's profiler wrote last
    superseded: dict | None = None  # a plain-loop capture that a later Keras fit's window replaces once it begins

    def on_jax(self, module) -> None:
        self.jax = module
        self.compiles = []
        self.status["jax_at"] = time.time()
        self.register_exit()
        monitoring = getattr(module, "monitoring", None)
        if monitoring is not None and hasattr(monitoring, "register_event_duration_secs_listener"):
            monitoring.register_event_duration_secs_listener(self._on_jax_event)
        self.save()

    def uses_jax(self) -> bool:
        """Whether the steps being captured are JAX's: Keras fit on the JAX backend, or a loop with no TF steps."""
        if self.jax is None:
            return False
        if self.fit_used:
            return self.keras_backend == "jax"
        return self.status.get("mode") == "jax-loop"

    # ---- the profiler sessions -------------------------------------------------------------------

    def start_jax(self, run_dir: str) -> None:
        """JAX's profiler over the window, and TensorFlow's beside it where the script imported TensorFlow."""
        self.jax.profiler.start_trace(run_dir)
        self.tf_side = None
        if self.tf is not None and self.start_profiler is not None:
            side = tempfile.mkdtemp(prefix="step-doctor-tf-")
            try:
                self.start_profiler(side)
                self.tf_side = side
            except Exception as error:  # JAX's capture goes on; tf.data's stages are then not named
                shutil.rmtree(side, ignore_errors=True)
                self.status["notes"].append(
                    f"TensorFlow's profiler could not run beside JAX's ({type(error).__name__}: {error}): the "
                    "profile has no tf.data stages."
                )

    def stop_jax(self, run_dir: str) -> None:
        try:
            self.jax.profiler.stop_trace()
        finally:
            sessions = _sessions(run_dir)
            self.last_session = sessions[-1] if sessions else None
            if self.tf_side is not None:
                side, self.tf_side = self.tf_side, None
                try:
                    self.tf.profiler.experimental.stop()
                finally:
                    self._move_tensorflow_file(side, run_dir)

    @staticmethod
    def _move_tensorflow_file(side: str, run_dir: str) -> None:
        """TensorFlow's xplane into JAX's newest session folder of this run, as <host>-tensorflow.xplane.pb."""
        sessions = _sessions(run_dir)
        written = glob.glob(os.path.join(side, "plugins", "profile", "*", "*.xplane.pb"))
        try:
            if sessions and written:
                host = os.path.basename(written[0])[: -len(".xplane.pb")]
                shutil.move(written[0], os.path.join(sessions[-1], f"{host}-tensorflow.xplane.pb"))
        finally:
            shutil.rmtree(side, ignore_errors=True)

    def jax_step_marker(self, step: int):
        return self.jax.profiler.StepTraceAnnotation("train", step_num=step)

    # ---- a plain JAX loop: a time window after the compiles ----------------------------------------

    def retake_for_fit(self) -> None:
        """Called as Keras fit begins: where a plain-loop window has already been captured, capture fit's own.

        That window began after JAX's compiles went quiet, and the compiles may have been Keras building the model:
        then what it held was the script making its data, not a training step. Fit's window is captured as in any
        fit, and the plain-loop session is removed once fit's has been captured (drop_superseded); where fit's window
        never begins or its capture fails, the plain-loop capture stays the run's (keep_loop_capture). The caller
        holds the lock, with fit_used set in the same hold, so the window's thread cannot end the plain-loop window
        between the two (_watch_jax_loop)."""
        with self.lock:  # end() may still be writing that capture
            if os.getpid() != self.pid or self.state != "done" or self.status.get("mode") != "jax-loop":
                return
            capture = self.status["capture"] or {}
            if capture.get("state") != "done":
                return
            self.superseded = {"session": self.last_session, "window": self.status["window"], "capture": capture}
            self.state = "waiting"
            began = round(time.time() - self.compiles[0], 1)  # a plain-loop window began after the first compile
            seconds = (self.status["window"] or {}).get("seconds", LOOP_SECONDS)
            self.note(
                f"profile took JAX's first compiles for a plain JAX loop's and captured {seconds:g} s from "
                f"{capture.get('at', 'then')}, but Keras fit began {began} s after JAX's first compile (JAX "
                "compiles as Keras builds a model, too): fit's steps are captured instead, with step markers, and "
                "that first capture is dropped once they are."
            )

    def drop_superseded(self) -> None:
        """Fit's window has been captured (end): the plain-loop session it replaces is removed."""
        if self.superseded is not None:
            kept, self.superseded = self.superseded, None
            if kept["session"]:
                shutil.rmtree(kept["session"], ignore_errors=True)

    def keep_loop_capture(self) -> None:
        """At exit: where fit's window never began or its capture failed, the plain-loop capture stays the run's."""
        if self.superseded is not None:
            kept, self.superseded = self.superseded, None
            self.status.update(mode="jax-loop", window=kept["window"], capture=kept["capture"])
            self.note("Keras fit's window was not captured: the plain-loop capture is kept.")

    def _on_jax_event(self, name: str, seconds: float, **kwargs) -> None:
        if not name.endswith(COMPILED) or os.getpid() != self.pid:
            return
        self.compiles.append(time.time())
        self.status["jax_compiles"] = len(self.compiles)  # saved with the status's next write
        if self.trial and self.trial.get("mode") not in (None, "jax-loop"):
            return  # a trial of `profile --prove` times the window the profile had (Keras fit's steps)
        if len(self.compiles) == 1 and not self.fit_used and self.state == "waiting":
            threading.Thread(target=self._watch_jax_loop, name="profile-jax-window", daemon=True).start()

    def _watch_jax_loop(self) -> None:
        first = self.compiles[0]
        while self.state == "waiting" and not self.fit_used:
            now = time.time()
            if now - self.compiles[-1] >= START_AFTER_S or now - first >= SETTLE_MAX_S:
                break
            time.sleep(0.05)
        with self.lock:
            if self.state != "waiting" or self.fit_used or self.calls:  # Keras fit, or TensorFlow's own steps
                return
            seconds = self.seconds or LOOP_SECONDS
            self.status["mode"] = "jax-loop"
            self.status["window"] = {"seconds": seconds, "after_first_compile_s": round(time.time() - first, 2)}
            self.begin(f"{time.time() - first:.1f} s after JAX's first compile")
        started = time.time()
        while self.state == "active" and time.time() - started < seconds and not self.fit_used:
            time.sleep(0.05)
        with self.lock:  # fit_used is set under it (keras_fit): a fit is in this window or after it, never between
            if self.state == "active" and self.fit_used:
                # Keras fit was still to come: a script that builds its model (JAX compiles its initializers) and
                # then takes over START_AFTER_S to make its data looked like a plain loop. Its fit steps are marked
                # from here on and end the window (keras_fit.step_begin), as in any fit.
                self.status["window"] = {"steps": list(self.window), "from": "Keras fit, begun in a plain-loop window"}
                return
            self.end(f"the window's {seconds:g} s ended")


def _sessions(run_dir: str) -> list[str]:
    """The run's profile session folders, oldest first (their names are the time they began)."""
    return sorted(glob.glob(os.path.join(run_dir, "plugins", "profile", "*")))
