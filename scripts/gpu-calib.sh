#!/bin/bash
# GPU calibration checks and timings, one call (carry bin/calib.tar.xz: model.test and qpack, and
# out/small-llama + out/calib.txt): the model package's calibration and precision tests, the 7B block
# forward benchmark, small-llama GPTQ with each --calib-math and its perplexity, and a synthetic
# Llama-2-7B GPTQ (128 × 2048 calibration tokens) with tf32 and bf16. Logs under $OUT.
# Build the carried archive here: mkdir -p bin/calib && for p in model gptq; do CGO_ENABLED=0 go test -c
#   -o bin/calib/$p.test ./$p; done && CGO_ENABLED=0 go build -o bin/calib/qpack ./cmd/qpack && tar -cJf bin/calib.tar.xz -C bin/calib .
# and copy the shared small-llama and calib.txt into out/ (git-ignored).
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT"
root=$PWD bin=$PWD/bin/calib work=/tmp/qpack-7b
mkdir -p "$bin" $work && tar -xJf bin/calib.tar.xz -C "$bin"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
("$bin/qpack" synth $work/s7 --vocab 2048 --calib-ids 262144 >/dev/null && cat $work/s7/*.safetensors >/dev/null) >"$OUT/synth.log" 2>&1 &
synth=$!
(cd "$root/model" && timeout 200 "$bin/model.test" -test.run 'GPUStaged|GPUReducedPrecision|GPUToBF16|GPUAddGramBF16|GPUCalibrate|GPUObserveOnly|GPUForwardMatchesCPU' -test.v -test.count=1 >"$OUT/test-model.log" 2>&1)
echo "model tests rc $?: $(grep -c '^--- PASS' "$OUT/test-model.log") passed, $(grep -c -- '--- FAIL' "$OUT/test-model.log") failed"
grep -E -- '--- FAIL|relative error|panic' "$OUT/test-model.log" | head -12
(cd "$root/gptq" && timeout 120 "$bin/gptq.test" -test.run 'GPUQuantizeGram' -test.v -test.count=1 >"$OUT/test-gptq.log" 2>&1)
echo "gptq tests rc $?: $(grep -c '^--- PASS' "$OUT/test-gptq.log") passed, $(grep -c -- '--- FAIL' "$OUT/test-gptq.log") failed"
grep -E -- '--- FAIL|panic' "$OUT/test-gptq.log" | head -5
(cd "$root/model" && timeout 120 "$bin/model.test" -test.run '^$' -test.bench GPUForward7B -test.benchtime 1x -test.v >"$OUT/bench-forward.log" 2>&1)
grep -E 'TFLOP' "$OUT/bench-forward.log" | head -3
for m in tf32 bf16; do
	"$bin/qpack" convert out/small-llama -o /tmp/sl-$m --device cuda --method gptq --calib out/calib.txt --calib-math $m --overwrite >"$OUT/sl-$m.log" 2>&1
	echo "small-llama gptq $m rc $?: $(grep -E '^gptq on' "$OUT/sl-$m.log")"
	"$bin/qpack" eval /tmp/sl-$m --data out/small-llama/heldout_ids.npy --device cuda -q 2>&1 | tail -2 | tee "$OUT/sl-eval-$m.log"
done
wait $synth
for m in tf32 bf16; do
	/usr/bin/time -f "7b $m: %e s wall" timeout 200 "$bin/qpack" convert $work/s7 -o $work/g-$m --device cuda --method gptq --calib $work/s7/calib_ids.npy \
		--calib-samples 128 --calib-seqlen 2048 --calib-math $m --overwrite --input-hash none >"$OUT/7b-$m.log" 2>&1
	grep -E '^gptq on|wall' "$OUT/7b-$m.log"
done
