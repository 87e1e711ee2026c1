"""The folder `step-doctor profile` puts first on the child's PYTHONPATH: sitecustomize.py runs at
Python start-up and loads capture.py. Both use the standard library only (the child may run another
environment); they are a package here only so that the project installs them with the rest."""
