# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-gpu lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/znni demo

test: $(VENV)/.installed-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports
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
