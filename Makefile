# `make run`  : set everything up, then run the Ape-X DQN CartPole example (all roles locally)
# `make test` : set everything up, then lint, build the documentation site strictly and run the whole
#               test suite (what .ci/run calls)
# `make docs` : build the documentation site into site/; `make docs-serve` serves it locally
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/apex_dqn_cartpole.yaml

.PHONY: setup thirdparty build lint format test run bench clean docs docs-serve

# torch is installed first, so that the project's `torch>=2.2` requirement is already
# satisfied and the editable install never picks a torch of its own. Which build
# `pip install torch==2.13.0` gets depends on the index pip uses: PyPI serves the CUDA
# build on Linux x86_64 (several GB with its nvidia-* wheels), the PyTorch index
# https://download.pytorch.org/whl/cpu the CPU one. Pick with:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu     # CPU build
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cu126   # a CUDA build (see pytorch.org)
#   make setup TORCH_SPEC="torch==2.13.0+cpu"                       # or any pip requirement / wheel file
# The default (both empty) is pip's configured index, as before.
# The build requirements go in first too, and the editable install builds with them
# (--no-build-isolation): against the venv's own numpy, so `build` below finds the
# extension up to date instead of compiling it a second time.
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
# The extras `make setup` installs (`pip install -e '.[$(EXTRAS)]'`): every integration, so that the
# suite tests them all.
EXTRAS := test,tb,atari,video,wandb,mlflow,ray,docs,offline

# Everything but aiorl itself: the venv, the build requirements, torch, and the third-party
# requirements of aiorl and of its extras (read from pyproject.toml). A target of its own so that
# CI can install a second Python's while the first one's set-up runs (.ci/run).
$(BIN)/.thirdparty: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=77" wheel "Cython>=3.0" "numpy>=2.0"
	@echo "installing $(TORCH_SPEC) from $(if $(TORCH_INDEX),$(TORCH_INDEX),pip's configured index (pip config list))"
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	@$(BIN)/python -c "import torch; print('installed torch', torch.__version__, '| CUDA build:', torch.version.cuda or 'none (CPU)')"
	$(BIN)/python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
		extras = p['optional-dependencies']; \
		print('\n'.join(p['dependencies'] + [r for e in sys.argv[1].split(',') for r in extras[e]]))" $(EXTRAS) \
		> $(VENV)/requirements-thirdparty.txt
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements-thirdparty.txt
	touch $@

thirdparty: $(BIN)/.thirdparty

# aiorl itself, editable, built against the venv's own numpy (--no-build-isolation), so that
# `build` below finds the extension up to date instead of compiling it a second time.
$(BIN)/.deps: $(BIN)/.thirdparty
	$(BIN)/python -m pip install --quiet --no-build-isolation -e '.[$(EXTRAS)]'
	touch $@

# Bench-only comparison libraries (cpprb has no wheel for every Python we support):
# never part of the test install; the benchmarks say which comparisons they skipped.
$(BIN)/.bench-deps: $(BIN)/.deps
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['bench']))" \
		| xargs -d '\n' $(BIN)/python -m pip install --quiet
	touch $@

setup: $(BIN)/.deps build

# Rebuild the Cython extensions in place (fails loudly if the compile fails), and compile the
# package's bytecode: an editable install gets none from pip, and with PYTHONDONTWRITEBYTECODE
# set every `aiorl` start would compile its modules again (a tenth of a second or more).
build: $(BIN)/.deps
	$(BIN)/python setup.py --quiet build_ext --inplace
	$(BIN)/python -m compileall -q aiorl

# ruff (configured in pyproject.toml): lint and import order, and the formatting `make format` applies.
LINTED := aiorl tests bench setup.py
lint: $(BIN)/.deps
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

format: $(BIN)/.deps
	$(BIN)/ruff check --select I --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

# The documentation site (mkdocs.yml), built strictly: a broken link or anchor, a page left out of the
# nav or a generated part that fails (docs/hooks/generated.py reads the config reference from aiorl,
# so the extension must be built) fails the build. NO_MKDOCS_2_WARNING silences Material's banner
# about its end of life (May 2027) on every build.
docs: build
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

docs-serve: build
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve

# The suite on three workers (pytest-xdist), one test file at a time per worker (module fixtures such
# as the Ray cluster are built once; a file's tests keep their order), the files in collection order
# (tests/conftest.py puts the long ones first). Much of a cluster test's time is waiting (for role
# processes to start, a stop criterion, a phase deadline): one worker kept about 0.6 of a core busy
# on the 2-core machine, so three fill both cores. The whole suite passed on three workers beside
# other runs at load 6-12. TEST_WORKERS=0 runs it in this process, as a plain `pytest` does.
TEST_WORKERS ?= 3
test: setup lint docs
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

run: setup
	$(BIN)/aiorl run $(CONFIG)

bench: setup $(BIN)/.bench-deps
	$(BIN)/python bench/replay.py --json bench-replay.json
	$(BIN)/python bench/transport.py --json bench-transport.json

clean:
	rm -rf build site $(VENV) aiorl/_ext/*.c aiorl/_ext/*.so
