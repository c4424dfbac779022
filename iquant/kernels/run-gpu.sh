#!/bin/sh
# GPU checks of the IQ fit (iquant.GPUFitter, kernels/iquant.cu). Build the test binaries first,
# on any machine with Go, from the repository root:
#   sh scripts/build-gpu-tests.sh
# then, on the GPU machine, from the repository root (bin/gpu carried there), after
# regenerating the PTX there (sh bin/gpu/run-all.sh -gen, or bin/gpu/ptxgen iquant/kernels/iquant.cu):
#   sh iquant/kernels/run-gpu.sh
# Every step runs even when an earlier one fails; the exit status is non-zero if any failed.
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/bin/gpu
status=0
run() { echo "== $*"; "$@" || status=1; }

cd "$root/iquant" || exit 1
# The kernel against Quantize, byte for byte, for every type on the fixture rows and random rows
# with every fixture importance (one subtest each), the refusals, and TestGPUPTXIsFresh (the
# embedded PTX against iquant.cu).
run "$bin/iquant.test" -test.v -test.count=1 -test.run 'TestGPU'
# 4096×11008 iq2_xs and iq4_xs with importance: MB/s of float32 input (transfers included),
# cpu-MB/s (Quantize on all cores, same run) and x-cpu.
run "$bin/iquant.test" -test.run '^$' -test.bench 'GPUFit' -test.benchtime 3x

cd "$root/convert" || exit 1
# tiny to iq4_nl on --device cuda, with and without --imatrix: every linear "on cuda", the files
# equal to --device cpu's byte for byte.
run "$bin/convert.test" -test.v -test.count=1 -test.run 'TestGPUIQuantSameBytes'
exit $status
