"""The Diagnose tab's entry point (doctor/pyproject.toml, `tensorboard_plugins`).

TensorBoard imports every `tensorboard_plugins` entry point with no guard around the import: a
plugin module that fails to import stops TensorBoard, its Profile tab included. So this module
imports only TensorBoard's base_plugin, and load() imports the plugin itself, returning None (no
tab, a warning in TensorBoard's log) when that fails, as xprof's own loader does.
"""

from __future__ import annotations

import logging

from tensorboard.plugins import base_plugin

logger = logging.getLogger(__name__)


class DiagnoseLoader(base_plugin.TBLoader):
    def load(self, context):
        try:
            from step_doctor.tensorboard.plugin import DiagnosePlugin
        except Exception as error:  # noqa: BLE001 (any failure to import leaves TensorBoard's other tabs working)
            logger.warning("step-doctor: the Diagnose tab is not available: %s: %s", type(error).__name__, error)
            return None
        return DiagnosePlugin(context)
