# `make run`  : set everything up, then run the Ape-X DQN CartPole example (all roles locally)
# `make test` : set everything up, then run the whole test suite (what .ci/run calls)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/apex_dqn_cartpole.yaml

.PHONY: setup build test run bench clean

# torch is installed first, pinned to the CPU wheel, so that the project's
# `torch>=2.2` requirement is already satisfied and pip never fetches a CUDA build.
# The build requirements go in first too, and the editable install builds with them
# (--no-build-isolation): against the venv's own numpy, so `build` below finds the
# extension up to date instead of compiling it a second time.
$(BIN)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=68" wheel "Cython>=3.0" "numpy>=2.0"
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-build-isolation -e '.[test,tb,atari]'
	touch $@

# Bench-only comparison libraries (cpprb has no wheel for every Python we support):
# never part of the test install; the benchmarks say which comparisons they skipped.
$(BIN)/.bench-deps: $(BIN)/.deps
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['bench']))" \
		| xargs -d '\n' $(BIN)/python -m pip install --quiet
	touch $@

setup: $(BIN)/.deps build

# Rebuild the Cython extensions in place (fails loudly if the compile fails).
build: $(BIN)/.deps
	$(BIN)/python setup.py --quiet build_ext --inplace

test: setup
	$(BIN)/python -m pytest

run: setup
	$(BIN)/aiorl run $(CONFIG)

bench: setup $(BIN)/.bench-deps
	$(BIN)/python bench/replay.py --json bench-replay.json
	$(BIN)/python bench/transport.py --json bench-transport.json

clean:
	rm -rf build $(VENV) aiorl/_ext/*.c aiorl/_ext/*.so
