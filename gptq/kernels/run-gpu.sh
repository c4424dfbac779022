#!/bin/sh
# GPU checks of GPTQ's searched group fits (Options.Weighted = --imatrix, Options.MSE = --clip) on
# the GPU solver. Build the test binaries first, on any machine with Go, from the repository root:
#   sh scripts/build-gpu-tests.sh
# then, on the GPU machine, from the repository root (bin/gpu carried there):
#   sh gptq/kernels/run-gpu.sh
# Every step runs even when an earlier one fails; the exit status is non-zero if any failed.
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/bin/gpu
status=0
run() { echo "== $*"; "$@" || status=1; }

cd "$root/gptq" || exit 1
# The Go port of amd64's math.Pow(d, 2.4) that the clip kernel mirrors, on this machine's CPU,
# with math.Exp's FMA path and (GODEBUG) without it.
run "$bin/gptq.test" -test.v -test.count=1 -test.run 'TestClipPow'
run env GODEBUG=cpu.fma=off "$bin/gptq.test" -test.v -test.count=1 -test.run 'TestClipPow'
# gptq_fit_search alone against blockwise.GroupParams (bit for bit), then GPTQ in every layout
# against the CPU solver (each subtest logs "N of M codes differ, P of Q group parameters"),
# and the solver's other GPU tests (the old min-max paths, now with MSE variants in
# TestGPUMatchesCPU and Weighted/MSE rows in TestGPULargerShapes).
run "$bin/gptq.test" -test.v -test.count=1 -test.run 'TestGPU'
# The cost: a 4096×11008 int3-g128 solve with min-max, Weighted and MSE groups ("TABLE" lines).
run "$bin/gptq.test" -test.run '^$' -test.bench 'GPUQuantizeSearched' -test.benchtime 1x

cd "$root/convert" || exit 1
# GPTQ --imatrix and --clip conversions of tiny on --device cuda: logs say "on cuda", errors
# within 3% of the all-CPU conversion's; NF4 stays "on cpu (Hessians on cuda)".
run "$bin/convert.test" -test.v -test.count=1 -test.run 'TestGPUCPUSolvedGPTQ'
exit $status
