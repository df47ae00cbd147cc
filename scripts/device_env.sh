#!/usr/bin/env bash
# Prepare a bare GPU machine (no package index) to import sparsile: unpack the wheels carried in
# .whl/ (see scripts/fetch_device_wheels.sh) into /tmp/site and expose the checkout as `sparsile`.
# Usage: source scripts/device_env.sh
set -e
mkdir -p /tmp/site /tmp/pkg
if [ ! -d /tmp/site/llvmlite ]; then
  tar xJf .whl/llvmlite-0.50.0.tar.xz -C /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/lark-*.whl
  if ! python3 -c "import cuda.bindings as c, sys; sys.exit(0 if int(c.__version__.split('.')[0]) >= 13 else 1)" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/cuda_*.whl
  fi
fi
ln -sfn "$PWD" /tmp/pkg/sparsile
export PYTHONPATH=/tmp/site:/tmp/pkg
export PYTHONUNBUFFERED=1
set +e
