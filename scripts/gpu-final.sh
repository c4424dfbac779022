#!/bin/bash
# The session's closing GPU check, one call of at most ten minutes (bin/gpu.tar.xz carried, and
# out/llq holding llama-quantize for the side-by-side run when there is time): every GPU test, the
# blockwise and FP4 kernel benchmarks, a synthetic Llama-2-7B to --preset Q4_K_M on the GPU three
# times (against llama-quantize when time allows), GPTQ 128 × 2048 with bf16 and tf32 calibration
# and awq+gptq 128 × 512. Logs under $OUT; a short table last.
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT"
root=$PWD start=$(date +%s) work=/tmp/qpack-7b
left() { echo $((${QPACK_BUDGET:-540} - ($(date +%s) - start))); }
tar -xJf bin/gpu.tar.xz -C bin
B=$root/bin/gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $work
("$B/qpack" synth $work/s7 --vocab 2048 --calib-ids 262144 >/dev/null && cp testdata/models/tiny/tokenizer.json $work/s7/ &&
	cat $work/s7/*.safetensors >/dev/null) >"$OUT/synth.log" 2>&1 &
synth=$!
declare -A pattern=([cuda]='.' [awq]='GPU|PTX' [blockwise]='GPU|PTX' [convert]='GPU' [gptq]='GPU|PTX' [iquant]='GPU|PTX' [kquant]='GPU|PTX' [model]='GPU')
for p in cuda awq blockwise gptq iquant kquant model convert; do
	(cd "$root/$p" && timeout 200 "$B/$p.test" -test.run "${pattern[$p]}" -test.v -test.count=1 >"$OUT/test-$p.log" 2>&1)
	echo "test $p: rc $?, $(grep -c '^--- PASS' "$OUT/test-$p.log") passed, $(grep -c '^--- FAIL' "$OUT/test-$p.log") failed, $(grep -c '^--- SKIP' "$OUT/test-$p.log") skipped"
	grep -E '^\s*--- FAIL|^panic|_test.go:[0-9]+: ' "$OUT/test-$p.log" | grep -v -- '--- PASS' | head -6
done
(cd blockwise && timeout 100 $B/blockwise.test -test.run '^$' -test.bench 'GPUQuantize$' -test.benchtime 20x >"$OUT/bench-blockwise.log" 2>&1)
(cd blockwise && timeout 60 $B/blockwise.test -test.run '^$' -test.bench 'GPUQuantizeFP4' -test.benchtime 20x >"$OUT/bench-fp4.log" 2>&1)
grep -h '^TABLE' "$OUT/bench-blockwise.log" "$OUT/bench-fp4.log" | grep -E '50M|180M|copy 1 GiB' | cut -c1-160
wait $synth
echo "after tests and benchmarks: $(left) s left"
for r in 1 2 3; do
	rm -f $work/q$r.gguf && sync
	/usr/bin/time -f "q4km cuda $r: %e s wall, %U s user" "$B/qpack" convert $work/s7 -o $work/q$r.gguf --format gguf --preset Q4_K_M --device cuda >"$OUT/q4km$r.log" 2>&1
	tail -1 "$OUT/q4km$r.log"
	grep '^time:' "$OUT/q4km$r.log"
done
cmp $work/q1.gguf $work/q3.gguf && echo "q4km runs identical"
rm -f $work/q*.gguf
conv() { # name, seconds, args...
	local name=$1 t=$2
	shift 2
	[[ $(left) -gt $((t + 20)) ]] || { echo "$name: skipped, $(left) s left"; return; }
	/usr/bin/time -f "$name: %e s wall" timeout "$t" "$B/qpack" convert $work/s7 --device cuda --overwrite "$@" >"$OUT/$name.log" 2>&1
	grep -E '^(gptq|awq\+gptq) on|wall' "$OUT/$name.log" | cut -c1-330
	rm -rf $work/g
}
ids="--calib $work/s7/calib_ids.npy"
conv gptq-bf16 60 -o $work/g --method gptq $ids --calib-samples 128 --calib-seqlen 2048 --calib-math bf16
conv gptq-tf32 70 -o $work/g --method gptq $ids --calib-samples 128 --calib-seqlen 2048
conv awqgptq-bf16 60 -o $work/g --method awq+gptq $ids --calib-samples 128 --calib-seqlen 512 --calib-math bf16
if [[ -x out/llq/llama-quantize && $(left) -gt 120 ]]; then
	"$B/qpack" export gguf $work/s7 -o $work/bf16.gguf --type bf16 --embed-type bf16 --overwrite >/dev/null 2>&1
	cat $work/bf16.gguf >/dev/null
	LD_LIBRARY_PATH=out/llq /usr/bin/time -f "llama-quantize Q4_K_M 16 threads: %e s wall, %U s user" timeout $(($(left) - 5)) out/llq/llama-quantize $work/bf16.gguf $work/l.gguf Q4_K_M 16 >"$OUT/llq.log" 2>&1
	tail -1 "$OUT/llq.log"
else
	echo "llama-quantize: skipped, $(left) s left"
fi
echo "done, $(left) s left"
