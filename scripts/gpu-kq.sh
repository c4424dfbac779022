#!/bin/bash
# The GPU k-quant pipeline's checks and the 7B --preset Q4_K_M timing (issue 21), one call with
# bin/gpu.tar.xz carried. Logs under $OUT.
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT"
root=$PWD
tar -xJf bin/gpu.tar.xz -C bin
B=$root/bin/gpu
t() { # package, pattern
	(cd "$root/$1" && timeout 200 "$B/$1.test" -test.count=1 -test.run "$2" -test.v >"$OUT/test-$1.log" 2>&1)
	echo "test $1 rc $?: $(grep -c '^--- PASS' "$OUT/test-$1.log") passed, $(grep -c -- '--- FAIL' "$OUT/test-$1.log") failed, $(grep -c -- '--- SKIP' "$OUT/test-$1.log") skipped"
	grep -E -- '--- FAIL|^panic' "$OUT/test-$1.log" | head -5
}
t kquant 'GPU|PTX'
t blockwise 'GPU|PTX'
t convert 'TestGPUKQuantSameBytes|TestGPUGGUFSameBytes|TestGPUIQuantSameBytes|TestKQuantRefusals|TestGPUFP4SameBytes'
(cd kquant && timeout 120 $B/kquant.test -test.run '^$' -test.bench GPUFit -test.benchtime 20x >"$OUT/bench-kquant.log" 2>&1)
grep -E 'Benchmark' "$OUT/bench-kquant.log"
(cd convert && timeout 120 $B/convert.test -test.run '^$' -test.bench ConvertGGUFQ4KM -test.benchtime 3x >"$OUT/bench-convert.log" 2>&1)
grep -E 'Benchmark' "$OUT/bench-convert.log"
QPACK_PROFILE_SKIP="blockwise gptq awq budget ncu kquant" bash scripts/gpu-profile.sh >"$OUT/profile.out" 2>&1
grep -E 'q4km|wall|time:' "$OUT/profile.out" | grep -v '^convert:' | tail -8
/usr/bin/time -f "cpu run: %e s wall" $B/qpack convert /tmp/qpack-7b/s7 -o /tmp/c.gguf --format gguf --preset Q4_K_M --device cpu --overwrite >"$OUT/cpu.log" 2>&1
tail -1 "$OUT/cpu.log"
cmp /tmp/qpack-7b/q.gguf /tmp/c.gguf && echo "cuda and cpu files identical"
