#!/bin/bash
# Where the GPU time goes, one call of at most ten minutes (bin/gpu.tar.xz carried; scripts/gpu-pack.sh
# builds it): the kernel benchmarks (k-quant fit, blockwise schemes, FP4) with Nsight Compute's
# duration of the k-quant kernel, then on a synthetic Llama-2-7B: --preset Q4_K_M to GGUF, GPTQ with
# 128 × 2048 calibration tokens (vocabulary 2048, tiny's tokenizer, for GGUF), awq+gptq and a budget conversion with 128 × 512, each with its log.
# Logs under $OUT; a short table last. QPACK_PROFILE_SKIP="gptq awq budget ..." leaves parts out.
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT"
root=$PWD bin=$PWD/bin/gpu work=/tmp/qpack-7b
skip=" ${QPACK_PROFILE_SKIP:-} "
tar -xJf bin/gpu.tar.xz -C bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
mkdir -p $work
(
	/usr/bin/time -f "synth: %e s wall" "$bin/qpack" synth $work/s7 --vocab 2048 --calib-ids 262144 && cp testdata/models/tiny/tokenizer.json $work/s7/ && cat $work/s7/*.safetensors >/dev/null
) >"$OUT/synth.log" 2>&1 &
synth=$!
bench() { # package, pattern, benchtime
	(cd "$root/$1" && timeout 150 "$bin/$1.test" -test.run '^$' -test.bench "$2" -test.benchtime "$3" >"$OUT/bench-$1-${2//[^A-Za-z0-9]/}.log" 2>&1)
}
[[ $skip == *" kquant "* ]] || bench kquant GPUFit 3x
[[ $skip == *" blockwise "* ]] || { bench blockwise 'GPUQuantize$' 20x; bench blockwise GPUQuantizeFP4 20x; }
[[ $skip == *" ncu "* ]] || (cd "$root/kquant" && timeout 120 ncu --clock-control none -k regex:kquant_fit_q4 --launch-count 1 \
	--section SpeedOfLight --section LaunchStats --section Occupancy "$bin/kquant.test" -test.run '^$' -test.bench GPUFit -test.benchtime 1x >"$OUT/ncu-kquant.log" 2>&1)
wait $synth
cat "$OUT/synth.log"
conv() { # name, timeout, args...
	local name=$1 t=$2
	shift 2
	/usr/bin/time -f "$name: %e s wall, %U s user, %M KB max RSS" timeout "$t" "$bin/qpack" convert $work/s7 --device cuda --overwrite "$@" >"$OUT/$name.log" 2>&1
	echo "$name rc $?" >>"$OUT/summary.txt"
}
ids="--calib $work/s7/calib_ids.npy"
[[ $skip == *" q4km "* ]] || for r in 1 2; do conv q4km$r 120 -o $work/q.gguf --format gguf --preset Q4_K_M; done
[[ $skip == *" gptq "* ]] || conv gptq 200 -o $work/g --method gptq $ids --calib-samples 128 --calib-seqlen 2048
[[ $skip == *" awq "* ]] || conv awqgptq 150 -o $work/a --method awq+gptq $ids --calib-samples 128 --calib-seqlen 512
[[ $skip == *" budget "* ]] || conv budget 150 -o $work/b --format qpack --method gptq --strategy budget --target-bpw 3.5 $ids --calib-samples 128 --calib-seqlen 512
echo "== tables"
cat "$OUT/summary.txt" 2>/dev/null
grep -h -E 'MB/s|of-copy|x-cpu' "$OUT"/bench-*.log | head -40
grep -E 'Duration|Registers|Achieved Occupancy|Memory Throughput|Compute \(SM\)' "$OUT/ncu-kquant.log" | head -8
for f in "$OUT"/q4km*.log "$OUT"/gptq.log "$OUT"/awqgptq.log "$OUT"/budget.log; do
	[[ -f $f ]] && { echo "-- $f"; grep -v '^\[' "$f" | grep -v -E '^(gptq|plan|awq) block|^convert: block' | tail -12; }
done
