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
# each), FitBlocks from BF16/F16/F32 against QuantizeRow+AppendRow, and the refusals;
# TestGPUPTXIsFresh checks the embedded PTX and cubin against kquant.cu.
run "$bin/kquant.test" -test.v -test.count=1 -test.run 'TestGPU'
# BenchmarkGPUFit: 4096×11008 q4_k with importance from float32: MB/s of input (uploads and
# downloads included), cpu-MB/s (QuantizeRow on all cores, same run), x-cpu, kernel-MB/s.
# BenchmarkGPUFitBlocks: the same shape from BF16 to q4_k/q6_k blocks, 1 and 3 callers: MB/s of
# BF16 input host to host, kernel-MB/s, h2d-GB/s, d2h-GB/s.
run "$bin/kquant.test" -test.run '^$' -test.bench 'GPUFit' -test.benchtime 20x

cd "$root/convert" || exit 1
# tiny to q4_k on --device cuda, with and without --imatrix: every linear "on cuda", the files
# equal to --device cpu's byte for byte; a BF16 synthetic Llama to --format gguf --preset Q4_K_M
# likewise (FitBlocks, token_embd and output included); and the k-quant device checks.
run "$bin/convert.test" -test.v -test.count=1 -test.run 'TestGPUKQuantSameBytes|TestGPUGGUFSameBytes|TestKQuantRefusals'
# The whole Q4_K_M conversion of a small synthetic Llama (32,000-token vocabulary) on the CPU and the GPU.
run "$bin/convert.test" -test.run '^$' -test.bench 'ConvertGGUFQ4KM' -test.benchtime 5x
exit $status
