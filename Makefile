# Every target wraps `python -m ...` inside .venv; `make help` lists them.
# Pass extra arguments to the Python command with ARGS, e.g.
#   make train-optimized ARGS="--set train.epochs=3 --set pipeline.batch_size=128"

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# tensorflow[and-cuda] where an NVIDIA driver answers, tensorflow-cpu elsewhere.
TF_EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(TF_EXTRA)
ARGS ?=
PORT ?= 6006
LOGDIR ?= runs

.PHONY: help setup data train-naive train-optimized compare tensorboard test clean

help: ## Show the targets and what they do
	@echo "Usage: make <target> [ARGS='--set key=value ...']"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP) ## Create .venv and install the project with pinned versions

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e ".[$(TF_EXTRA),dev]"
	@touch $@

data: setup ## Build the synthetic dataset (TFRecord shards in data/build; no-op when built)
	$(PY) -m train data --config configs/base.yaml $(ARGS)

train-naive: data ## Train the naive baseline (Python generator, serial, no prefetch) into runs/naive
	$(PY) -m train fit --config configs/naive.yaml $(ARGS)

train-optimized: data ## Train the optimized pipeline into runs/optimized
	$(PY) -m train fit --config configs/optimized.yaml $(ARGS)

compare: data ## Train naive and optimized on the same data and model; print the comparison
	$(PY) -m train compare $(ARGS)

tensorboard: setup ## Serve runs/ with the Profile tab on http://127.0.0.1:6006 (PORT=, LOGDIR=)
	$(PY) -m train tensorboard --logdir $(LOGDIR) --port $(PORT)

test: setup ## Run the test suite (fast CPU tests on tiny generated data)
	$(PY) -m pytest $(ARGS)

clean: ## Remove runs/ and the built datasets (keeps .venv)
	rm -rf runs data/build .pytest_cache
