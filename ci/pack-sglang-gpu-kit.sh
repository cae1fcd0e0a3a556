#!/usr/bin/env bash
# The SGLang 0.5.17 kit for a lent GPU host (no network there): the pinned packages of ci/sglang-0.5.17-gpu-kit.txt,
# downloaded for CPython 3.12 on x86-64, unpacked into one site directory with the parts this path never loads left
# out (docs/gpu-proof.md, "The SGLang kit"), and packed as one xz tarball small enough to travel with the checkout.
#
#   bash ci/pack-sglang-gpu-kit.sh [OUT]        # OUT: default .kit/sglang-0.5.17-gpu-site.tar.xz
#
# The wheels are cached in ~/.cache/sglperf/sglang-gpu-wheels; their SHA-256 sums are printed (and written beside
# OUT), so two packs can be compared. ci/gpu-proof-sglang.sh unpacks it on the host.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.kit/sglang-0.5.17-gpu-site.tar.xz}
LIST=ci/sglang-0.5.17-gpu-kit.txt
WHEELS=${SGLPERF_CACHE:-$HOME/.cache/sglperf}/sglang-gpu-wheels
mkdir -p "$WHEELS" "$(dirname "$OUT")"
t=$(date +%s)
plat=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 \
         manylinux_2_5 manylinux1; do plat+=(--platform "${p}_x86_64"); done
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none "${plat[@]}" --platform any -d "$WHEELS" -r "$LIST"
echo "downloaded (or found in $WHEELS) in $(( $(date +%s) - t )) s"
python3 - "$LIST" "$WHEELS" "$OUT" <<'PY'
import fnmatch, hashlib, io, os, re, sys, tarfile, zipfile
from pathlib import Path

listing, wheels, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
# Never loaded on this path (triton attention, pytorch sampling, no grammar backend, Hopper): docs/gpu-proof.md
TRIMS = ["sgl_kernel/flash_ops*",            # FA3, 1.1 GB unpacked: imported only for --attention-backend fa3
         "sgl_kernel/sm100/*",               # Blackwell's build: Hopper loads sm90/
         "sgl_kernel/infllm_ops*",           # InfLLM-v2 sparse attention, loaded lazily by its own models
         "sgl_kernel/flashmla_ops*",         # FlashMLA (MLA models; its import is guarded)
         "sglang/multimodal_gen/*",          # diffusion serving
         "sglang/*_core*.so",                # the Rust router/gRPC parts (SGLANG_RUST_SERVER, --grpc-port only)
         "xgrammar/*.a"]                     # a static library for C++ builds
pins = [ln.split("#")[0].strip() for ln in listing.read_text().splitlines()]
pins = [p for p in pins if p]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
found = {}
for w in sorted(wheels.glob("*.whl")):
    name, ver = w.name.split("-")[:2]
    found[(norm(name), ver)] = w
tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
kept = dropped = 0
with tarfile.open(tmp, "w:xz", preset=6) as tar:
    for pin in pins:
        name, ver = pin.split("==")
        w = found.get((norm(name), ver))
        if w is None:
            sys.exit(f"pack-sglang-gpu-kit: {pin} was not downloaded into {wheels}")
        print(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}")
        with zipfile.ZipFile(w) as z:
            for info in z.infolist():
                path = re.sub(r"^[^/]+\.data/(purelib|platlib)/", "", info.filename)
                if info.is_dir() or re.match(r"^[^/]+\.data/", path):
                    continue  # scripts and headers: nothing on this path runs them
                if any(fnmatch.fnmatch(path, t) for t in TRIMS):
                    dropped += info.file_size
                    continue
                data = z.read(info)
                ti = tarfile.TarInfo(f"site/{path}")
                ti.size, ti.mtime, ti.mode = len(data), 0, 0o755 if path.endswith(".so") else 0o644
                tar.addfile(ti, io.BytesIO(data))
                kept += info.file_size
os.replace(tmp, out)
print(f"kit: {out}: {out.stat().st_size / 2**20:.1f} MiB packed, {kept / 2**20:.0f} MiB unpacked, "
      f"{dropped / 2**20:.0f} MiB trimmed, {len(pins)} packages")
PY
sha256sum "$OUT" | tee "$OUT.sha256"
