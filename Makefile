# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-gpu lint bench clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Numba's agglomeration kernels are compiled into its cache once, here, so that a first
# `znni agglomerate` does not spend ~10 s of its run compiling them
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -m znni.engine.agglomerate.compile_kernels
	touch $@

# --no-compile: pip's byte-compiling of every installed module took 50 of its 85 s on 2 cores
# (torch, scipy, openvino...); the tests import a fraction of them, compiled on first import
# and written once (the test target lets Python write bytecode, below)
$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --no-compile -e '.[test]'
	$(BIN)/python -m znni.engine.agglomerate.compile_kernels
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/znni demo

# Debian's chromium for the dashboard's browser tests (tests/api/test_dashboard_browser.py),
# installed with apt where there is apt and root or password-less sudo; elsewhere those tests
# skip and say why. Nothing is done where a chromium is already on the PATH.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if ! command -v apt-get >/dev/null 2>&1; then echo "make test: no chromium and no apt-get: the browser tests will skip"; exit 0; fi; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "make test: no chromium, and apt-get needs root: the browser tests will skip"; exit 0; fi; \
	  echo "make test: installing Debian's chromium for the browser tests"; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium fonts-dejavu-core >/dev/null \
	    || echo "make test: apt-get could not install chromium: the browser tests will skip"; }

# Python may write bytecode here even where PYTHONDONTWRITEBYTECODE is set: otherwise every
# process the tests start (hundreds) would compile src (0.35 s each, measured) and every
# module pip did not compile, again and again
test: export PYTHONDONTWRITEBYTECODE :=
test: $(VENV)/.installed-test browser
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --durations=15 -m "not gpu"

# Every @pytest.mark.gpu test, on the CUDA device; fails (never skips) without one. The gpu
# extra that matches the driver (nvidia-smi's "CUDA Version", 12.x or 13.x) is installed
# first. Only the files that hold gpu tests are collected.
CUDA_MAJOR = $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
GPU_TEST_FILES = $(shell grep -rlE 'pytest\.mark\.gpu' tests --include='test_*.py' | sort)

$(VENV)/.installed-gpu: $(VENV)/.installed-test pyproject.toml
	@case "$(CUDA_MAJOR)" in \
	  12|13) $(BIN)/python -m pip install -q -e '.[test,gpu-cuda$(CUDA_MAJOR)]' && touch $@ ;; \
	  *) echo "make test-gpu: no CUDA 12 or 13 driver found (nvidia-smi), so no gpu extra installed" ;; \
	esac

test-gpu: $(VENV)/.installed-gpu
	ZNNI_REQUIRE_GPU=1 $(BIN)/python -m pytest -q -m gpu -p no:cacheprovider $(GPU_TEST_FILES)

bench: $(VENV)/.installed-test
	$(BIN)/znni bench layers
	$(BIN)/znni bench networks

clean:
	rm -rf $(VENV) znni-demo .pytest_cache
