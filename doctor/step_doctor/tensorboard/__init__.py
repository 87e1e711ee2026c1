"""The Diagnose tab: the doctor's diagnosis of every profiled run under TensorBoard's log folder.

loader.py        the entry point TensorBoard loads; imports the rest only when it can
plugin.py        the plugin: its routes, is_active, the frontend's metadata
discovery.py     the runs with a profile and the compare folders, found without following links
analyses.py      each profile diagnosed once, in a background thread (the tab polls its state)
scratch_diagnosis.py  one run's diagnosis, made in a scratch copy, never writing into the log folder
utilization.py   the sampler's CPU, GPU and SM activity series around a run
comparison.py    a compare folder's report.json, side by side
text_summary.py  the verdict as a text summary, for TensorBoard's own Text tab
static/          the frontend: ES modules and a stylesheet, served as they are
"""
