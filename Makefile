# rooftop: `make demo` runs the built-in campaign, `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint venv clean

venv: $(STAMP)

# torch first, pinned and on its own, so no loose requirement drags in a CUDA build.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	# Triton, for the kernel tests on the CPU (its interpreter, and its compiler for sm_90 without a
	# GPU). A CUDA build of torch brings the Triton it was built with; that one is kept.
	$(BIN)/python -c "import triton" 2>/dev/null || $(BIN)/python -m pip install -q triton==3.6.0
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rooftop demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
