#!/bin/sh
# Builds what scripts/gpu-check.sh runs into bin/gpu.tar.xz (git-ignored; carry it with the
# call): the GPU packages' test binaries (scripts/build-gpu-tests.sh) and qpack itself.
set -eu
cd "$(dirname "$0")/.."
sh scripts/build-gpu-tests.sh
CGO_ENABLED=0 go build -ldflags="-s -w" -o bin/gpu/qpack ./cmd/qpack
rm -f bin/gpu/cmd_qpack.test bin/gpu/evaluate.test # no GPU test of their own that runs without the shared models
tar -cJf bin/gpu.tar.xz -C bin gpu
ls -la bin/gpu.tar.xz
