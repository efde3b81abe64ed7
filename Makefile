# `make run`  : set everything up, then run the Ape-X DQN CartPole example (all roles locally)
# `make test` : set everything up, then run the whole test suite (what .ci/run calls)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/apex_dqn_cartpole.yaml

.PHONY: setup build test run bench clean

# torch is installed first, pinned to the CPU wheel, so that the project's
# `torch>=2.2` requirement is already satisfied and pip never fetches a CUDA build.
$(BIN)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=68" wheel "Cython>=3.0"
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test,bench,atari,video,wandb,mlflow]'
	touch $@

setup: $(BIN)/.deps build

# Rebuild the Cython extensions in place (fails loudly if the compile fails).
build: $(BIN)/.deps
	$(BIN)/python setup.py --quiet build_ext --inplace

test: setup
	$(BIN)/python -m pytest

run: setup
	$(BIN)/aiorl run $(CONFIG)

bench: setup
	$(BIN)/python bench/replay.py --json bench-replay.json
	$(BIN)/python bench/transport.py --json bench-transport.json

clean:
	rm -rf build $(VENV) aiorl/_ext/*.c aiorl/_ext/*.so
