"""One run set-up (prepare_run.py -> run_setup.py's RunSetup) and the loops that train it: Keras `fit` and the
multi-worker custom loop."""
