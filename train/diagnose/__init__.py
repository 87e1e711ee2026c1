"""The analyser: offline, without TensorFlow, from any log folder that holds a profile.

xprof conversion -> host trace -> steps (marked or inferred) -> input wait down the tf.data
iterator tree -> typed causes -> verdict and recommendations (`python -m train diagnose`)
"""
