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

# Every @pytest.mark.gpu test, on the CUDA device; fails (never skips) without one. Only the
# files that hold gpu tests are collected, so a GPU box needs znni[test] and a gpu extra
# (README: GPU) but none of the server or object-store test servers. Install the extra
# that matches `nvidia-smi`'s "CUDA Version" first: pip install -e '.[gpu-cuda13]'.
GPU_TEST_FILES = $(shell grep -rlE 'pytest\.mark\.gpu' tests --include='test_*.py' | sort)
test-gpu: $(VENV)/.installed-test
	ZNNI_REQUIRE_GPU=1 $(BIN)/python -m pytest -q -m gpu -p no:cacheprovider $(GPU_TEST_FILES)

bench: $(VENV)/.installed-test
	$(BIN)/znni bench layers
	$(BIN)/znni bench networks

clean:
	rm -rf $(VENV) znni-demo .pytest_cache
