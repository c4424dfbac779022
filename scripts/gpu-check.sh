#!/bin/bash
# One GPU-machine session for the merged IQ, FP4 and mixture-of-experts work, in one call of at
# most ten minutes, from the repository root with bin/gpu.tar.xz carried (scripts/gpu-pack.sh
# builds it here). Writes logs under $OUT and prints a short table last.
#  1. every GPU test (the GPU against its pure-Go reference on fresh random data), per package;
#  2. while they run, qpack synth writes a Mixtral-8x7B-shaped model cut to QPACK_MIX_LAYERS
#     blocks (hidden 4096, 8 experts of MLP 14336, top-2: each block the full model's block);
#  3. the GPU benchmarks of the FP4 and IQ kernels and the device-to-device copy they compare with;
#  4. GPTQ int4-g128 of the cut Mixtral with 128 × 2048 calibration tokens on one GPU: wall time
#     and peak GPU memory (per block, so the full model's peak; its time scales with the blocks).
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT"
root=$PWD
bin=$root/bin/gpu
layers=${QPACK_MIX_LAYERS:-8}
mix=/tmp/qpack-mix
tar -xJf bin/gpu.tar.xz -C bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

start=$(date +%s)
(
	/usr/bin/time -f "synth: %e s wall, %M KB max RSS" "$bin/qpack" synth "$mix" --layers "$layers" --hidden 4096 \
		--intermediate 14336 --heads 32 --kv-heads 8 --vocab 32000 --experts 8 --experts-per-token 2 --calib-ids 262144
	du -sh "$mix"
	cat "$mix"/*.safetensors >/dev/null
) >"$OUT/synth.log" 2>&1 &
synth=$!

declare -A pattern=(
	[cuda]='.'
	[awq]='GPU|PTX'
	[blockwise]='GPU|PTX'
	[convert]='GPU'
	[gptq]='GPU|PTX'
	[iquant]='GPU|PTX'
	[kquant]='GPU|PTX'
	[model]='GPU'
)
summary=()
for p in cuda awq blockwise gptq iquant kquant model convert; do
	(cd "$root/$p" && timeout 240 "$bin/$p.test" -test.run "${pattern[$p]}" -test.v -test.count=1 >"$OUT/test-$p.log" 2>&1)
	rc=$?
	pass=$(grep -c '^--- PASS' "$OUT/test-$p.log")
	fail=$(grep -c '^--- FAIL' "$OUT/test-$p.log")
	skip=$(grep -c '^--- SKIP' "$OUT/test-$p.log")
	summary+=("test $p: rc $rc, $pass passed, $fail failed, $skip skipped")
	grep -E '^(--- FAIL|panic)' "$OUT/test-$p.log" | head -5
done

(cd "$root/blockwise" && timeout 120 "$bin/blockwise.test" -test.run '^$' -test.bench 'GPUQuantizeFP4' -test.benchtime 20x >"$OUT/bench-fp4.log" 2>&1)
(cd "$root/iquant" && timeout 120 "$bin/iquant.test" -test.run '^$' -test.bench 'GPUFit' -test.benchtime 1x >"$OUT/bench-iq.log" 2>&1)

wait $synth
cat "$OUT/synth.log"
left=$((590 - ($(date +%s) - start)))
if [ "$left" -gt 60 ]; then
	CUDA_VISIBLE_DEVICES=0 /usr/bin/time -f "convert: %e s wall, %M KB max RSS" timeout $((left - 10)) "$bin/qpack" convert "$mix" \
		-o /tmp/qpack-mix-gptq --device cuda --method gptq --calib "$mix/calib_ids.npy" --calib-samples 128 \
		--calib-seqlen 2048 --input-hash none >"$OUT/mix-gptq.log" 2>&1
	summary+=("mixtral ($layers blocks) gptq rc $?")
else
	summary+=("mixtral gptq: no time left ($left s)")
fi

echo "== tables"
grep -h '^TABLE' "$OUT"/bench-*.log "$OUT"/test-*.log
grep -E 'ns/op|MB/s|x-cpu|of-copy' "$OUT"/bench-*.log | head -20
grep -E '^gptq on |^time:|^wrote|^convert: .* wall|^gptq block (0|1|7|31): |experts' "$OUT/mix-gptq.log" | head -20
printf '%s\n' "${summary[@]}"
