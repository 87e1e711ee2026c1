"""Shared infrastructure every layer may import: errors meant for the user, atomic file writes, a quiet
TensorFlow import, the step counting every Keras callback of the project shares, and where one command
leaves a result that another reads."""
