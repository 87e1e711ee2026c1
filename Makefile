# Every target that runs Python wraps one `python -m ...` command; `make help` lists them.
# Pass extra arguments to that command with ARGS, e.g.
#   make train-optimized ARGS="--set train.epochs=3 --set pipeline.batch_size=128"

SHELL := /bin/bash
.DEFAULT_GOAL := help

ARGS ?=
# auto: the CPU scenario where no GPU is found; or a name in configs/scenarios/ (larger_than_memory), none
SCENARIO ?= auto
# The workload (train/workloads/): image, the presets in configs/; any other registered one, the presets in
# configs/<name>/ (text: docs/text.md; yours: docs/make-it-yours.md), e.g. make compare TASK=text. WORKLOAD= is the same.
WORKLOAD ?= image
TASK ?= $(WORKLOAD)
PRESETS := $(if $(wildcard configs/$(TASK)/optimized.yaml),configs/$(TASK),configs)
ifeq ($(PRESETS)$(filter image,$(TASK)),configs)
$(error TASK=$(TASK): no presets in configs/$(TASK)/ (base, naive, optimized: a workload's, docs/make-it-yours.md))
endif
# the workload's presets for the commands that compare them (compare, bench, ladder, sweep-batch)
PAIR := --naive $(PRESETS)/naive.yaml --optimized $(PRESETS)/optimized.yaml
PORT ?= 6006
# diagnose reads runs/compare and tensorboard serves runs/ unless LOGDIR names another log folder
LOGDIR ?=
WORKERS ?= 2
DISPATCHER_PORT ?= 5050
WORKER_PORT ?= 5051
DISPATCHER ?= localhost:$(DISPATCHER_PORT)

ifdef TEMPLATE_IN_CONTAINER
# Inside the Docker image (see Dockerfile) the project is installed into the system Python.
PY := python
STAMP :=
else
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# tensorflow[and-cuda] where an NVIDIA driver answers, tensorflow-cpu elsewhere.
TF_EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(TF_EXTRA)
# The exact versions for that extra: constraints-gpu.txt (tensorflow[and-cuda] and its CUDA wheels)
# or constraints.txt (tensorflow-cpu).
SETUP_CONSTRAINTS := $(if $(filter gpu,$(TF_EXTRA)),constraints-gpu.txt,constraints.txt)
endif

.PHONY: help setup data train-naive train-optimized train-multiworker data-dispatcher data-worker compare bench bench-check ladder sweep-batch tune prove diagnose bench-diagnose tensorboard test test-fast test-long test-doctor-alone test-container-stack lint docs clean \
        docker-build docker-train-naive docker-train-optimized docker-compare docker-tensorboard

help: ## Show the targets and what they do
	@echo "Usage: make <target> [TASK=image|text|<your workload>] [ARGS='--set key=value ...']"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP) ## Create .venv and install the project with the pinned versions (constraints.txt; constraints-gpu.txt with a GPU)

ifndef TEMPLATE_IN_CONTAINER
$(STAMP): pyproject.toml doctor/pyproject.toml $(SETUP_CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -c $(SETUP_CONSTRAINTS) -e "./doctor[bench,test,jax]" -e ".[$(TF_EXTRA),dev]"
	@touch $@
endif

data: setup ## Build the synthetic dataset (TFRecord shards in shards/; no-op when built; TASK=text: the text corpus)
	$(PY) -m train data --config $(PRESETS)/base.yaml --scenario $(SCENARIO) $(if $(filter data,$(MAKECMDGOALS)),$(ARGS))

train-naive: data ## Train the naive baseline (Python generator, serial, no prefetch) into runs/naive
	$(PY) -m train fit --config $(PRESETS)/naive.yaml $(ARGS)

train-optimized: data ## Train the optimized pipeline into runs/optimized
	$(PY) -m train fit --config $(PRESETS)/optimized.yaml $(ARGS)

train-multiworker: data ## Train the optimized preset with WORKERS local processes (MultiWorkerMirroredStrategy)
	$(PY) -m train launch --workers $(WORKERS) -- fit --config configs/optimized.yaml --set train.strategy=multi_worker $(ARGS)

data-dispatcher: setup ## Run a tf.data service dispatcher on DISPATCHER_PORT (5050) until Ctrl-C
	$(PY) -m train data-service dispatcher --port $(DISPATCHER_PORT) $(ARGS)

data-worker: data ## Run a tf.data service worker on WORKER_PORT (5051) for DISPATCHER (localhost:5050)
	$(PY) -m train data-service worker --port $(WORKER_PORT) --dispatcher $(DISPATCHER) $(ARGS)

compare: data ## Naive vs optimized on the same data and model: table + runs/compare/report.{md,png,json}
	$(PY) -m train compare $(PAIR) --scenario $(SCENARIO) $(ARGS)

bench: data ## Naive vs optimized vs compute ceiling, interleaved trials -> runs/bench/bench.json
	$(PY) -m train bench $(PAIR) --scenario $(SCENARIO) $(ARGS)

bench-check: data ## Check the benchmark harness: A/A and order checks, both scenarios -> runs/bench-check/
	$(PY) -m train bench-check $(ARGS)

ladder: data ## One optimization at a time from naive, each measured -> runs/ladder/ladder.{json,md,png}
	$(PY) -m train ladder $(PAIR) --scenario $(SCENARIO) $(ARGS)

sweep-batch: data ## Throughput and utilization against batch size -> runs/sweep-batch/sweep.{json,png}
	$(PY) -m train sweep-batch $(PAIR) --scenario $(SCENARIO) $(ARGS)

tune: data ## Search the speed knobs for your data and machine (ARGS="--minutes 10") -> configs/tuned.yaml, runs/tune/
	$(PY) -m train tune --config $(PRESETS)/optimized.yaml --scenario $(SCENARIO) $(ARGS)

prove: data ## The doctor's fixes for make compare's naive run, each measured as a config overlay (ARGS="--allow generator,batch") -> runs/prove/
	$(PY) -m train prove --config $(PRESETS)/naive.yaml --optimized $(PRESETS)/optimized.yaml --scenario $(SCENARIO) $(ARGS)

diagnose: setup ## Verdict and ranked fixes for any log folder with a profile (LOGDIR=runs/compare)
	$(PY) -m step_doctor diagnose $(or $(LOGDIR),runs/compare) $(ARGS)

bench-diagnose: setup ## Wall time and peak RSS of diagnose against profile size, 1 MB to 1 GB -> runs/bench-diagnose/bench.{json,png}
	PYTHONPATH=doctor $(PY) -m step_doctor_dev.bench_diagnose $(ARGS)

tensorboard: setup ## Serve runs/ with the Diagnose and Profile tabs on http://127.0.0.1:6006 (LOGDIR=, PORT=)
	$(PY) -m train tensorboard --logdir $(or $(LOGDIR),runs) --port $(PORT) $(ARGS)

# Each product tests itself: the template's tests (tests/), the doctor's (doctor/tests/, run from doctor/), in turn or
# side by side (tests/run_both.py). ARGS go to both pytest runs (e.g. ARGS="-x -k corpus").

test: setup ## Run the test suite CI runs: fast and slow tests of the template and the doctor (CPU, 9-10 minutes on 2 cores)
	$(PY) tests/run_both.py --in-turn "not long" $(ARGS)

test-fast: setup ## Run the tests not marked slow or long, the two products side by side (under 90 s), for the edit-test loop
	$(PY) tests/run_both.py "not slow and not long" $(ARGS)

test-long: setup ## Run the tests marked long: the benchmark harness end to end, the whole profile corpus, the longest reliability tests (25-41 minutes)
	$(PY) tests/run_both.py --in-turn long $(ARGS)

test-doctor-alone: setup ## Install the doctor alone beside tensorflow-cpu in a fresh virtualenv and profile a Keras script there (2 minutes)
	cd doctor && $(abspath $(PY)) -m pytest -m install $(ARGS)

# The container-stack check: the project on the TensorFlow that the Docker image's base ships
# (2.17, see constraints-container.txt), on CPU, in its own venv with the image's Python (3.12)
# where one runs here, else python3.11. tensorflow-cpu and tensorboard stand in for the image;
# then the Dockerfile's rule: keep the image's tensorflow*/tensorboard*, the rest from
# constraints-container.txt.
CONTAINER_VENV ?= .venv-container
CONTAINER_PYTHON ?= $(firstword $(foreach p,python3.12 $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12),$(shell $(p) -c 'import venv' >/dev/null 2>&1 && echo $(p))) python3.11)

# The fast tests, and the slow ones that read what TensorFlow itself records (profiles, training): its version matters.
STACK_TESTS = not long and (not slow or stack)
test-container-stack: $(CONTAINER_VENV)/.installed ## Run the fast tests and those marked stack on the Docker image's stack (TensorFlow 2.17, Python 3.12) in .venv-container
	$(CONTAINER_VENV)/bin/python -m pytest -m "$(STACK_TESTS)" $(ARGS)
	cd doctor && $(abspath $(CONTAINER_VENV))/bin/python -m pytest -m "$(STACK_TESTS)" $(ARGS)

$(CONTAINER_VENV)/.installed: pyproject.toml doctor/pyproject.toml constraints-container.txt
	rm -rf $(CONTAINER_VENV)
	$(CONTAINER_PYTHON) -m venv $(CONTAINER_VENV)
	$(CONTAINER_VENV)/bin/python -m pip install --upgrade pip
	$(CONTAINER_VENV)/bin/python -m pip install -c constraints-container.txt tensorflow-cpu tensorboard
	$(CONTAINER_VENV)/bin/python -m pip freeze | grep -iE '^(tensorflow|tf[-_]keras|tensorboard)[a-z_-]*==' > $(CONTAINER_VENV)/keep-base.txt
	$(CONTAINER_VENV)/bin/python -m pip install -c $(CONTAINER_VENV)/keep-base.txt -c constraints-container.txt -e "./doctor[bench,test]" -e ".[dev]"
	@touch $@

lint: setup ## Lint the code (ruff, import-linter), the Dockerfile (hadolint), docker-compose.yml (Compose v2), the Kubernetes manifests and the docs (mkdocs --strict), offline
	$(PY) -m train lint $(ARGS)

# The documentation site (mkdocs.yml, docs/): built into site/ (git-ignored); --strict fails on a broken link or anchor.
docs: setup ## Build the documentation site into site/ (serve it while you edit with .venv/bin/mkdocs serve)
	$(PY) -m mkdocs build --strict $(ARGS)

# Kubernetes (see docs/scaling-out.md): the manifests of deploy/k8s/ for your image and
# number of trainer pods, written to deploy/k8s/rendered/ for `kubectl apply -f`.
IMAGE ?= gpu-utilization-template:latest
.PHONY: k8s
k8s: setup ## Render the Kubernetes manifests for IMAGE with WORKERS trainer pods into deploy/k8s/rendered/
	$(PY) -m train k8s --image $(IMAGE) --workers $(WORKERS) $(ARGS)

# The GPU path (see docs/docker.md). Each target needs a Docker engine with Compose v2
# and the NVIDIA Container Toolkit, and stops at once with a clear message where there is none.
# The containers write runs/ and shards/ on the host as you (bind mounts, see docker-compose.yml).
NEED_DOCKER = @docker info >/dev/null 2>&1 || { echo "error: no Docker engine answers here ('docker info' failed). The docker-* targets need Docker with Compose v2 and the NVIDIA Container Toolkit on a GPU host; without them use the same targets without 'docker-' (make train-optimized, make compare)." >&2; exit 1; }; mkdir -p runs shards
export HOST_UID := $(shell id -u)
export HOST_GID := $(shell id -g)

docker-build: ## Build the GPU image on NVIDIA's TensorFlow container (BASE_IMAGE= to change)
	$(NEED_DOCKER)
	docker compose build

docker-train-naive: ## Train the naive preset on the GPU, in Docker
	$(NEED_DOCKER)
	docker compose run --rm train-naive

docker-train-optimized: ## Train the optimized preset on the GPU, in Docker
	$(NEED_DOCKER)
	docker compose run --rm train-optimized

docker-compare: ## Naive vs optimized on the GPU, in Docker; report in runs/compare
	$(NEED_DOCKER)
	docker compose run --rm compare

docker-tensorboard: ## TensorBoard for runs/ from Docker, on http://127.0.0.1:6006
	$(NEED_DOCKER)
	docker compose up tensorboard

clean: ## Remove runs/ and the built datasets (keeps .venv)
	rm -rf runs shards .pytest_cache

# Profile your own training script, unchanged (README and docs/doctor.md): SCRIPT="my_train.py ARGS"
# runs as `python my_train.py ARGS` with the capture injected, then diagnose reads what it captured.
# ARGS go to `step-doctor profile` (--logdir, --steps A-B, --seconds S, --json).
SCRIPT ?=
NEED_SCRIPT = @test -n "$(SCRIPT)" || { echo 'error: name the script and its arguments, e.g. make profile SCRIPT="my_train.py --epochs 3"' >&2; exit 2; }

.PHONY: profile bench-prove bench-held-out bench-profile docker-profile gpu-check

profile: setup ## Profile your own training script, unchanged, and diagnose it (SCRIPT="my_train.py ARGS")
	$(NEED_SCRIPT)
	$(PY) -m step_doctor profile $(ARGS) -- $(PY) $(SCRIPT)

gpu-check: setup ## The doctor on Keras-on-JAX, starved and fed: this machine's CPU part here (doctor/tools/gpu_check.sh for a GPU host) -> runs/gpu-check/
	$(PY) doctor/tools/gpu_check.py --out runs/gpu-check $(ARGS)

bench-prove: setup ## The doctor's estimates against what profile --prove measures, on the planted corpus -> runs/prove-corpus/prove.{json,md}
	PYTHONPATH=doctor $(PY) -m step_doctor_dev.prove_corpus $(ARGS)

bench-held-out: setup ## The doctor's first fix on held-out scripts against the same fix by hand, and prove's -> runs/held-out/held_out.{json,md}
	PYTHONPATH=doctor $(PY) -m step_doctor_dev.bench_held_out $(ARGS)

bench-profile: setup ## What profile costs a run outside its capture window: a corpus script with and without it
	PYTHONPATH=doctor $(PY) -m step_doctor_dev.bench_profile $(ARGS)

docker-profile: ## Profile SCRIPT in Docker with GPU traces (root + CAP_SYS_ADMIN; files handed back to you)
	$(NEED_DOCKER)
	$(NEED_SCRIPT)
	docker compose run --rm profile step-doctor profile --chown $(HOST_UID):$(HOST_GID) $(ARGS) -- python $(SCRIPT)
