#!/usr/bin/env bash
# scripts/gpu/pack.sh -- builds the library with its CUDA backend here and
# packs what scripts/gpu/check.sh needs on a GPU machine that has neither
# the CPU libraries (OpenBLAS, LAPACKE) nor a package registry: the stripped
# test binary and library, and the shared libraries they load, into
# .devpack/pack.tar.xz (ignored by git; carried to the machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -j"$(nproc)" CUDA=1 WERROR=1 lib build/test_birkhoff
rm -rf .devpack && mkdir -p .devpack/stage/build .devpack/stage/libs
cp build/test_birkhoff build/libbirkhoff.so .devpack/stage/build/
for l in $(ldd build/test_birkhoff | awk '/=>/{print $3}'); do
    case $(basename "$l") in libc.so*|libm.so*|libgcc_s*|libstdc++*) ;; *) cp -L "$l" .devpack/stage/libs/ ;; esac
done
strip --strip-unneeded .devpack/stage/build/* .devpack/stage/libs/*
tar -C .devpack/stage -cJf .devpack/pack.tar.xz .
rm -rf .devpack/stage
ls -la .devpack/pack.tar.xz
