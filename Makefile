# The two commands a newcomer types: `make serve` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PORT ?= 8000
MODEL ?= minivllm-demo

.PHONY: install test lint serve profile-serve clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# torch first, pinned to the CPU build on this disk, so nothing resolves a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check minivllm tests benchmarks scripts

test: install lint
	# One intra-op thread: servers and clients share the cores in tests, and spinning
	# OpenMP threads on a busy 2-core machine cost far more than they bring.
	OMP_NUM_THREADS=1 $(PY) -m pytest tests

serve: install
	@echo "Try: curl http://127.0.0.1:$(PORT)/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": \"$(MODEL)\", \"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story about a cat.\"}]}'"
	$(VENV)/bin/minivllm serve $(MODEL) --port $(PORT)

$(VENV)/.profile-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[profile]'
	touch $@

# py-spy on `minivllm serve` under the standard bench serve trace: the engine thread's top
# functions and lines, and who holds the GIL. PROFILE_ARGS="--num-prompts 32" is a shorter run.
profile-serve: $(VENV)/.profile-installed
	$(PY) benchmarks/profile_serve.py $(PROFILE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
