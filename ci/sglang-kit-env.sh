# Sourced by ci/gpu-proof-sglang.sh and ci/capture-sglang-spec-answers.sh: SGLang from the kit
# (ci/pack-sglang-gpu-kit.sh) beside the GPU host's own torch, nothing installed. `sglang_kit_env SITE JIT [LOG]`
# unpacks $KIT into SITE once (a later call on the same host reuses it), restores $JIT_CACHE into an empty JIT,
# and exports the environment: the kit first on PYTHONPATH (its transformers and tokenizers override the host's),
# then the checkout; ninja and nvcc on PATH for the JIT compiles; the JIT caches under JIT; NVLink multicast off in
# every process (shared hosts). LOG (a command, default echo) says what it did. Returns 3 where the kit does not
# unpack.
sglang_kit_env() {
  local site=$1 jit=$2 say=${3:-echo} t
  mkdir -p "$site" "$jit"
  if [ ! -f "$site/.unpacked" ]; then
    t=$(date +%s)
    tar -xJf "${KIT:?KIT names the kit tarball}" -C "$site" || { $say "unpacking $KIT failed"; return 3; }
    touch "$site/.unpacked"
    $say "kit unpacked in $(( $(date +%s) - t )) s"
  fi
  if [ -n "${JIT_CACHE:-}" ] && [ -z "$(ls -A "$jit")" ]; then
    tar -xJf "$JIT_CACHE" -C "$jit" --strip-components=1 && $say "JIT caches restored from $JIT_CACHE"
  fi
  export PYTHONPATH=$site/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  PATH=$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$CUDA_HOME/bin:$PATH
  export PATH TRITON_CACHE_DIR=$jit/triton TVM_FFI_CACHE_DIR=$jit/tvm-ffi FLASHINFER_WORKSPACE_BASE=$jit
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}
