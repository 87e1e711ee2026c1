"""step-doctor: why your accelerator waits, read from a TensorBoard profile, for any TensorFlow training script.

    step-doctor profile -- python train.py   the script unchanged, its steps captured, then diagnosed
    step-doctor diagnose LOGDIR              any log folder with a profile; needs no TensorFlow
    tensorboard --logdir LOGDIR              the same diagnosis in the Diagnose tab

Layout (each layer imports only what is under it; nothing here imports the training template):

    cli.py            the commands
    profile/          the runner (the parent: sampling, status) and site/ (the capture inside the script)
    diagnose/         the analyser: profile -> steps -> input wait -> causes -> verdict, without TensorFlow
    sampler.py        NVML/GPM and CPU utilization in a background thread, without TensorFlow
    callbacks.py      Keras callbacks for a script of your own: StepTraceProfiler (the one module that imports
                      TensorFlow and Keras: the script's own)
    scale/            what diagnose costs against the size of the profile, and a synthetic XSpace writer
    errors.py, files.py, machine.py
"""

__version__ = "0.1.0"
