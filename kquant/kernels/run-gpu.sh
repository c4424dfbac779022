#!/bin/sh
# GPU checks of the k-quant fit (kquant.GPUFitter, kernels/kquant.cu). Build the test binaries first,
# on any machine with Go, from the repository root:
#   sh scripts/build-gpu-tests.sh
# then, on the GPU machine, from the repository root (bin/gpu carried there):
#   sh kquant/kernels/run-gpu.sh
# Every step runs even when an earlier one fails; the exit status is non-zero if any failed.
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/bin/gpu
status=0
run() { echo "== $*"; "$@" || status=1; }

cd "$root/kquant" || exit 1
# The kernels against QuantizeRow, byte for byte, on every row kind, K and importance (one subtest
# each), and the refusals; TestGPUPTXIsFresh checks the embedded PTX against kquant.cu.
run "$bin/kquant.test" -test.v -test.count=1 -test.run 'TestGPU'
# 4096×11008 q4_k with importance: MB/s of float32 input (uploads and downloads included),
# cpu-MB/s (QuantizeRow on all cores, same run) and x-cpu.
run "$bin/kquant.test" -test.run '^$' -test.bench 'GPUFit' -test.benchtime 3x

cd "$root/convert" || exit 1
# tiny to q4_k on --device cuda, with and without --imatrix: every linear "on cuda", the files
# equal to --device cpu's byte for byte; and the k-quant device checks.
run "$bin/convert.test" -test.v -test.count=1 -test.run 'TestGPUKQuantSameBytes|TestKQuantRefusals'
exit $status
