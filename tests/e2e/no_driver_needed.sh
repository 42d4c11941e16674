#!/usr/bin/env bash
# The binaries link the CUDA build of LibTorch, yet none may need the CUDA
# driver (libcuda.so.1) to start: CI and CPU-only servers have none, and
# LibTorch loads it lazily on a GPU machine. Checks, for each binary given:
#   - readelf: no libcuda.so* among its own NEEDED entries;
#   - ldd: every library it needs resolves (the RUNPATH finds the torch
#     wheel's libraries without LD_LIBRARY_PATH), and libcuda is not among
#     them;
#   - one libnccl and one libcudart in the whole closure, both the wheel's;
#   - libstdc++ before any torch library among its NEEDED entries: the
#     wheel's libtorch exports an unversioned std::filesystem that would
#     otherwise take the place of the system libstdc++'s, and crash.
# The last argument is a command to run (the first binary with it) to show
# the process really starts.
set -euo pipefail
run_arg="${@: -1}"
bins=("${@:1:$#-1}")
fail=0
for bin in "${bins[@]}"; do
  name=$(basename "$bin")
  before=$fail
  fail=0
  if readelf -d "$bin" | grep -E "NEEDED.*\[libcuda\.so" >/dev/null; then
    echo "FAIL $name: readelf -d lists libcuda as NEEDED"; fail=1
  fi
  first=$(readelf -d "$bin" | grep -o -E "\[(libstdc\+\+\.so[^]]*|libtorch[^]]*|libc10[^]]*)\]" | sed -n 1p)
  if [ -n "$first" ] && [ "${first#[libstdc++}" = "$first" ]; then
    echo "FAIL $name: $first comes before libstdc++ among its NEEDED libraries"; fail=1
  fi
  deps=$(env -u LD_LIBRARY_PATH ldd "$bin")
  if grep -q "not found" <<<"$deps"; then
    echo "FAIL $name: unresolved libraries:"; grep "not found" <<<"$deps"; fail=1
  fi
  if grep -E "^\s*libcuda\.so" <<<"$deps" >/dev/null; then
    echo "FAIL $name: libcuda is in its load closure"; fail=1
  fi
  for lib in libnccl.so libcudart.so; do
    paths=$( (grep -E "^\s*$lib" <<<"$deps" || true) | awk '{print $3}' | xargs -r readlink -f | sort -u)
    if [ "$(grep -c . <<<"$paths" || true)" -gt 1 ]; then
      echo "FAIL $name: more than one $lib: $paths"; fail=1
    fi
    if [ -n "$paths" ] && ! grep -q "site-packages/nvidia" <<<"$paths"; then
      echo "FAIL $name: $lib is not the torch wheel's: $paths"; fail=1
    fi
  done
  [ $fail -eq 0 ] && echo "ok   $name ($(grep -c "=>" <<<"$deps") libraries resolved)"
  fail=$((fail | before))
done
# shellcheck disable=SC2086
env -u LD_LIBRARY_PATH "${bins[0]}" $run_arg > /dev/null || { echo "FAIL: ${bins[0]} $run_arg did not start"; fail=1; }
exit $fail
