"""Shared infrastructure every layer may import: errors meant for the user, atomic file writes, a quiet
TensorFlow import, and the step counting every Keras callback of the project shares."""
