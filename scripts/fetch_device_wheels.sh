#!/usr/bin/env bash
# Download (here, where PyPI is reachable) the packages the GPU machine lacks, into .whl/ (ignored
# by git). llvmlite is repacked as a stripped tar.xz so that everything fits the 64 MiB transfer.
set -e
mkdir -p .whl /tmp/whl
plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download --no-deps $plat -d /tmp/whl llvmlite==0.50.0 lark==1.3.1 cuda-bindings==13.0.3 cuda-pathfinder
cp /tmp/whl/lark-*.whl /tmp/whl/cuda_*.whl .whl/
rm -rf /tmp/llx && mkdir /tmp/llx && (cd /tmp/llx && unzip -q /tmp/whl/llvmlite-0.50.0-*.whl && strip --strip-unneeded llvmlite/binding/libllvmlite.so && tar cf - llvmlite llvmlite-0.50.0.dist-info | xz -9 -T0 > "$OLDPWD/.whl/llvmlite-0.50.0.tar.xz")
ls -la .whl
