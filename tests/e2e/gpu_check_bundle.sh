#!/usr/bin/env bash
# tools/gpu-check on this machine: --prepare packs a bundle of the build's
# binaries and non-torch libraries within the size a device call carries,
# and --run on that bundle (through the bundled loader and C library, as on a
# GPU machine with an older glibc) finds torch, runs its steps and writes a
# JSON summary that counts them.
set -euo pipefail
src="$1" build="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$src"
SLICESCHED_BUILD_DIR="$build" tools/gpu-check --prepare --no-build --out "$tmp/bundle"
test -s "$tmp/bundle.tar.gz"
SLICESCHED_GPU_CHECK_LOADER=1 tools/gpu-check --run --bundle "$tmp/bundle.tar.gz" --out "$tmp/summary.json" \
  --only torch-info,executor-runtime,nccl
python3 - "$tmp/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
steps = {x["step"]: x for x in s["steps"]}
assert s["bundled_loader"] is True, s
assert steps["torch-info"]["status"] == "pass", steps["torch-info"]
assert '"cuda_build": "13.0"' in steps["torch-info"]["tail"], steps["torch-info"]
assert steps["executor-runtime"]["status"] == "pass", steps["executor-runtime"]
if s["cuda_devices"] < 2:
    assert steps["nccl"]["status"] == "skip" and "two CUDA devices" in steps["nccl"]["why"], steps["nccl"]
assert s["failed"] == 0 and s["passed"] == 2, s
print("gpu-check bundle: ok")
PY
