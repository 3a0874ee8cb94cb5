#!/usr/bin/env bash
# On the GPU machine, in the repository root: unpacks bench/cuda/pack.sh's archive (carried in
# build/device) and links the path the build was made at to this checkout, where the tests look
# for their data. Source it, so that LD_LIBRARY_PATH (and PATH, for a packed Node) stay set:
#
#   . bench/cuda/unpack.sh && LODE_REQUIRE_GPU=1 build/lode_tests --gtest_filter='Cuda*'
tar -xJf build/device/pack.tar.xz || return 1 2>/dev/null || exit 1
built_at=$(cat build/source-root)
if [ "$built_at" != "$PWD" ] && [ ! -e "$built_at" ]; then
  mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"
fi
export LD_LIBRARY_PATH=$PWD/build/runtime-libs:${LD_LIBRARY_PATH:-}
[ -x build/node/bin/node ] && export PATH=$PWD/build/node/bin:$PATH
true
