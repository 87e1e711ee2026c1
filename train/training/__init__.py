"""One run set-up (setup.py) and the loops that train it: Keras `fit` and the multi-worker custom loop."""
