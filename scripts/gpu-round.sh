#!/bin/bash
# One round of GPU checks (bin/t.tar.xz carried: the cuda, blockwise, gptq, model and convert test
# binaries and qpack, built with CGO_ENABLED=0 go test -c): the GPU tests of those packages
# (patterns below), the blockwise benchmark lines for QPACK_BENCH, then scripts/gpu-scale.sh's
# conversions (bin/q.tar.xz carried too) with what time is left of QPACK_BUDGET (540 s).
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT" bin/t
root=$PWD start=$(date +%s)
tar -xJf bin/t.tar.xz -C bin/t
declare -A pattern=(
	[blockwise]=${QPACK_BLOCKWISE_TESTS:-'GPU|PTX'}
	[gptq]='GPU|PTX'
	[awq]='GPU|PTX'
	[model]='GPU'
	[convert]=${QPACK_CONVERT_TESTS:-'SeveralGPUs|GPUCPUSolved|GPUFP4|GPUAWQ|GPUExperts|GPUPlan'}
	[cuda]='.')
for p in ${QPACK_TEST_PACKAGES:-cuda blockwise gptq model convert}; do
	(cd "$root/$p" && timeout 200 "$root/bin/t/$p.test" -test.run "${pattern[$p]}" -test.v -test.count=1 >"$OUT/test-$p.log" 2>&1)
	echo "test $p: rc $?, $(grep -c '^\s*--- PASS' "$OUT/test-$p.log") passed, $(grep -c '^\s*--- FAIL' "$OUT/test-$p.log") failed, $(grep -c '^\s*--- SKIP' "$OUT/test-$p.log") skipped"
	grep -E -B12 -- '^\s*--- FAIL|^panic' "$OUT/test-$p.log" | grep -v -e '--- PASS' -e '^=== ' | tail -30 | cut -c1-300
done
for b in ${QPACK_BENCH:-}; do
	(cd blockwise && timeout 150 "$root/bin/t/blockwise.test" -test.run '^$' -test.bench "$b" -test.benchtime 10x 2>&1 | grep -E '^TABLE|FAIL|panic' | awk '!seen[$0]++' | cut -c1-190)
done
QPACK_BUDGET=$((${QPACK_BUDGET:-540} - ($(date +%s) - start))) bash scripts/gpu-scale.sh
