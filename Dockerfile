# The GPU path: the project on NVIDIA's TensorFlow container (CUDA, cuDNN, NCCL and a tuned
# TensorFlow build included). Pick another base with --build-arg BASE_IMAGE=..., e.g.
# tensorflow/tensorflow:2.21.0-gpu. The TensorFlow that the base image ships is kept as is.
ARG BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE_IMAGE}
# What pip installs next to the base image's TensorFlow: constraints-container.txt is the set
# resolved and tested (make test-container-stack, in CI) on the default base image's stack.
# Another base needs its own, e.g. --build-arg CONSTRAINTS=constraints.txt for
# tensorflow/tensorflow:2.21.0-gpu (the versions `make setup` tests with TensorFlow 2.21).
ARG CONSTRAINTS=constraints-container.txt

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TEMPLATE_IN_CONTAINER=1 \
    TF_CPP_MIN_LOG_LEVEL=1 \
    TF_GPU_THREAD_MODE=gpu_private \
    TF_GPU_THREAD_COUNT=2

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /workspace/template

# Dependencies first, from the same spec `make setup` uses (pyproject.toml), with the base
# image's TensorFlow pinned so pip can neither replace nor upgrade it, and everything else at
# the versions of $CONSTRAINTS. Where both name a package the base image's version wins (awk
# drops it from the constraints; with the default base they agree). NVIDIA's image ships the
# old `pynvml` package (11.4), whose pynvml.py has no GPM functions and shadows nvidia-ml-py's
# module of the same name: nvidia-ml-py is reinstalled on top so SM activity can be read (the
# newer binding keeps the old API that the image's own tools use). Code changes below
# this layer do not reinstall anything (each package's own __init__.py is all an editable
# install needs; the rest of train/, data/ and doctor/ arrives with the code below). The
# doctor (doctor/) is installed first: the template depends on it.
COPY pyproject.toml README.md constraints.txt constraints-container.txt ./
COPY train/__init__.py train/
COPY data/__init__.py data/
COPY doctor/pyproject.toml doctor/README.md doctor/
COPY doctor/step_doctor/__init__.py doctor/step_doctor/
RUN python -m pip freeze | grep -iE '^(tensorflow|tf[-_]keras|tensorboard)[a-z_-]*==' > /tmp/keep-base.txt; \
    awk -F'==' '{ name = tolower($1); gsub(/[-_.]+/, "-", name) } \
        NR == FNR { keep[name]; next } /^[^#]/ && !(name in keep)' \
        /tmp/keep-base.txt "${CONSTRAINTS}" > /tmp/constraints.txt && \
    python -m pip install -c /tmp/keep-base.txt -c /tmp/constraints.txt -e "./doctor[bench]" -e . && \
    python -m pip install --no-deps --force-reinstall -c /tmp/constraints.txt nvidia-ml-py && \
    python -c "import tensorflow as tf, keras, tensorflow_datasets, pynvml; print('TensorFlow', tf.__version__, 'Keras', keras.__version__, 'GPM', hasattr(pynvml, 'nvmlGpmSampleGet'))"

COPY . .
# The fix for TensorFlow's profiler crash under MultiWorkerMirroredStrategy (docs/doctor.md), built into a folder
# only root can write and checked against this image's TensorFlow here, so that a pod never compiles anything.
ENV STEP_DOCTOR_CONSUME_FIX=/opt/step-doctor/traceme_consume_fix.so
RUN python -m step_doctor.profile.site.consume_fix prebuild "${STEP_DOCTOR_CONSUME_FIX}"
RUN useradd --create-home --uid 1000 trainer && \
    mkdir -p runs shards && chown -R trainer:trainer /workspace/template
USER 1000:1000

CMD ["make", "help"]
