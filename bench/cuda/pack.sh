#!/usr/bin/env bash
# Packs this machine's CUDA build for the GPU machine, which has no compiler toolchain of ours and
# no network: build/lode, build/lode_tests and (when built) build/bench_cuda_matvec and
# build/bench_cuda_gemm_bits, the shared libraries it lacks (fmt, gomp, pcre2, utf8proc,
# cpp-httplib) in build/runtime-libs, and the path the build was made at (the tests find their data
# there), in one archive under build/device/, the folder to carry. bench/cuda/unpack.sh undoes it there.
#
#   scripts/build && bench/cuda/pack.sh         # then run(carry=["build/device"], ...)
#
# With NODE=1, this machine's `node` (a self-contained build: it links only the C and C++ runtimes)
# and the one module the load generator (tools/load) imports, tools/server/node_modules/openai
# (it has no dependencies; the whole node_modules would not fit the carry limit), go in instead of
# the test and bench binaries: with them the archive and the tree would pass the carry limit, and
# the served parts (bench/cuda/issue_runs.sh served, stress) run only build/lode.
set -euo pipefail
cd "$(dirname "$0")/../.."
for f in build/lode build/lode_tests; do
  [ -x "$f" ] || { echo "pack: $f is missing; build first (scripts/build)" >&2; exit 1; }
done
mkdir -p build/runtime-libs build/device
ldd build/lode build/lode_tests | awk '/=> \// {print $3}' | sort -u |
  grep -E 'lib(fmt|gomp|pcre2|utf8proc|cpp-httplib)' | xargs -r cp -L -t build/runtime-libs
pwd >build/source-root
files=(build/lode build/runtime-libs build/source-root)
if [ -z "${NODE:-}" ]; then
  files+=(build/lode_tests)
  [ -x build/bench_cuda_matvec ] && files+=(build/bench_cuda_matvec)
  [ -x build/bench_cuda_gemm_bits ] && files+=(build/bench_cuda_gemm_bits)
else
  node=$(command -v node) || { echo "pack: NODE=1 but no node here" >&2; exit 1; }
  [ -d tools/server/node_modules/openai ] || { echo "pack: tools/server/node_modules/openai is missing (tools/server/fetch)" >&2; exit 1; }
  rm -rf build/node && mkdir -p build/node/bin && cp -L "$node" build/node/bin/node
  files+=(build/node tools/server/node_modules/openai)
fi
tar -cJf build/device/pack.tar.xz "${files[@]}"
echo "pack: build/device/pack.tar.xz, $(du -m build/device/pack.tar.xz | cut -f1) MiB (the carry limit is 64 MiB with the tree)"
