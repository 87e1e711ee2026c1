"""The Diagnose tab's backend: a TensorBoard plugin with a few JSON routes and its static frontend.

Routes, under /data/plugin/diagnose:
    /index.js, /<file>       the frontend (static/: ES modules and a stylesheet, no build step)
    /runs                    the runs with a profile (one per worker of a multi-worker run) and the compare folders
    /run?run=NAME            the run's diagnosis, or its state while it is analysed (the tab polls)
    /utilization?run=NAME    the CPU, GPU and SM activity the sampler recorded around the run
    /compare?folder=NAME     a compare folder's report.json, its runs side by side
    /report.png?folder=NAME  the picture compare drew
A NAME is looked up among what discovery.py found; anything else is a 404 (discovery.py says why).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from step_doctor.tensorboard import comparison, discovery, utilization
from step_doctor.tensorboard.analyses import Analyses

PLUGIN_NAME = "diagnose"
STATIC = Path(__file__).parent / "static"
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css"}
RESCAN_S = 2.0  # a name not in the last listing rescans the log folder at most this often
INACTIVE_RECHECK_S = 10.0  # is_active() runs on every /data/plugins_listing: a "no" is rechecked this often


class DiagnosePlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        # A log folder TensorBoard reads through a URL (gs://, s3://) or a --logdir_spec is not a local
        # path: the tab then stays inactive.
        self._root = Path(context.logdir).resolve() if context.logdir and "://" not in context.logdir else None
        self._analyses = Analyses(self._root) if self._root else None
        self._lock = threading.Lock()
        self._listing = discovery.Listing()
        self._scanned_at = float("-inf")
        self._active = False
        self._checked_at = float("-inf")
        self._checking = threading.Lock()
        self._usage: dict[tuple, dict] = {}

    def get_plugin_apps(self):
        apps = {
            "/runs": self._serve_runs,
            "/run": self._serve_run,
            "/utilization": self._serve_utilization,
            "/compare": self._serve_compare,
            "/report.png": self._serve_report_image,
        }
        for path in STATIC.iterdir():
            if path.suffix in CONTENT_TYPES:
                apps["/" + path.name] = self._static(path)
        return apps

    def is_active(self) -> bool:
        """Whether the log folder holds a profile or a compare report. The first answer is looked up here; a
        "no" is looked up again in the background (a walk of a large folder that holds neither takes up to
        half a second), so /data/plugins_listing never waits on it; a "yes" is kept."""
        if self._active or self._root is None:
            return self._active
        now = time.monotonic()
        if self._checked_at == float("-inf"):
            self._checked_at = now
            self._active = discovery.has_any(self._root)
        elif now - self._checked_at >= INACTIVE_RECHECK_S and not self._checking.locked():
            self._checked_at = now
            threading.Thread(target=self._recheck, name="step-doctor-is-active", daemon=True).start()
        return self._active

    def _recheck(self) -> None:
        with self._checking:
            if discovery.has_any(self._root):
                self._active = True

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Diagnose", disable_reload=True)

    def _scan(self) -> discovery.Listing:
        listing = discovery.scan(self._root) if self._root else discovery.Listing()
        with self._lock:
            self._listing, self._scanned_at = listing, time.monotonic()
        if listing.runs or listing.compares:
            self._active = True
        return listing

    def _find(self, kind: str, name: str | None):
        """The run or compare folder of that name, as discovery found it; None for anything else."""
        if not name:
            return None
        with self._lock:
            listing, fresh = self._listing, time.monotonic() - self._scanned_at < RESCAN_S
        found = getattr(listing, kind).get(name)
        if found is None and not fresh:
            found = getattr(self._scan(), kind).get(name)
        return found

    @staticmethod
    def _json(request, content, code: int = 200):
        return http_util.Respond(request, content, "application/json", code=code)

    def _missing(self, request, what: str):
        return self._json(request, {"error": f"no such {what} under this log folder"}, code=404)

    def _static(self, path: Path):
        body, content_type = path.read_bytes(), CONTENT_TYPES[path.suffix]

        @wrappers.Request.application
        def serve(request):
            return http_util.Respond(request, body, content_type)

        return serve

    @wrappers.Request.application
    def _serve_runs(self, request):
        listing = self._scan()
        runs = []
        for run in listing.runs.values():
            profile_run = run.session.name if run.name == "." else f"{run.name}/{run.session.name}"
            runs.append(
                {
                    "name": run.name,
                    "group": run.group,
                    "role": run.role,
                    "session": run.session.name,
                    "hosts": [p.name.removesuffix(discovery.PROFILE_SUFFIX) for p in run.xplanes],
                    "size_mb": round(run.size_mb(), 2),
                    "profile_run": profile_run,  # the Profile tab's name for this capture
                }
            )
        compares = [{"name": c.name, "image": c.image is not None} for c in listing.compares.values()]
        return self._json(
            request,
            {"logdir": str(self._root or ""), "runs": runs, "compares": compares, "truncated": listing.truncated},
        )

    @wrappers.Request.application
    def _serve_run(self, request):
        run = self._find("runs", request.args.get("run"))
        if run is None:
            return self._missing(request, "run")
        try:
            found = self._analyses.state(run)
        except OSError:  # its files went away since the listing
            return self._missing(request, "run")
        return self._json(request, {"run": run.name, **found})

    @wrappers.Request.application
    def _serve_utilization(self, request):
        run = self._find("runs", request.args.get("run"))
        if run is None:
            return self._missing(request, "run")
        files = utilization.event_files(run.folder, self._root)
        try:  # the sampler may still be appending: a new size or mtime reads the files again
            key = (run.name,) + tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
        except OSError:  # removed since they were listed
            return self._missing(request, "utilization record")
        if key not in self._usage:
            self._usage = {k: v for k, v in self._usage.items() if k[0] != run.name}
            self._usage[key] = utilization.of_run(run.folder, self._root)
        return self._json(request, {"run": run.name, **self._usage[key]})

    @wrappers.Request.application
    def _serve_compare(self, request):
        folder = self._find("compares", request.args.get("folder"))
        if folder is None:
            return self._missing(request, "compare folder")
        try:
            return self._json(request, comparison.read(folder, self._listing))
        except comparison.ReportError as error:
            return self._json(request, {"error": str(error)}, code=422)

    @wrappers.Request.application
    def _serve_report_image(self, request):
        folder = self._find("compares", request.args.get("folder"))
        if folder is None or folder.image is None or not discovery.regular_file(folder.image):
            return self._missing(request, "report picture")
        return http_util.Respond(request, folder.image.read_bytes(), "image/png")
