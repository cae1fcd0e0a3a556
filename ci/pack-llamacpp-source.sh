#!/usr/bin/env bash
# The pinned llama.cpp tree (vendored in the llama-cpp-python sdist that `sglperf llamacpp build` uses), trimmed to
# what a CPU or CUDA llama-server build needs, as one tarball for hosts without network:
#   bash ci/pack-llamacpp-source.sh OUT.tar.xz      (about 7 MB; `sglperf llamacpp build --source OUT.tar.xz`)
set -euo pipefail
out=$(realpath -m "${1:?usage: pack-llamacpp-source.sh OUT.tar.xz}")
version=$(python3 -c 'from sglperf.engines.llamacpp_build import LLAMA_CPP_PYTHON; print(LLAMA_CPP_PYTHON)')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version"
tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
src=$(echo "$tmp"/llama_cpp_python-*/vendor/llama.cpp)
# not built with the suite's flags (LLAMA_BUILD_TESTS/EXAMPLES off; only the CPU and CUDA backends)
( cd "$src" && rm -rf models docs media benches gguf-py conversion examples pocs tests .devops .github \
    ggml/src/ggml-{vulkan,sycl,metal,opencl,cann,openvino,webgpu,et,hexagon,musa,hip,zdnn} )
tar -C "$(dirname "$src")" -cJf "$out" llama.cpp
ls -la "$out"
