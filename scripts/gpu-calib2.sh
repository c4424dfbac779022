#!/bin/bash
# GPU calibration timings with their breakdown and the BF16 quality check on mid-llama, one call
# (carry bin/calib.tar.xz with qpack, out/mid.tar.xz holding mid-llama, out/calib.txt). Logs under $OUT.
# bin/calib.tar.xz: CGO_ENABLED=0 go build -o bin/calib/qpack ./cmd/qpack && tar -cJf bin/calib.tar.xz -C bin/calib .
# out/mid.tar.xz: tar -cJf out/mid.tar.xz -C ../shared/models mid-llama (xz: 25 MB, so that it travels).
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT"
bin=$PWD/bin/calib work=/tmp/qpack-7b
mkdir -p "$bin" $work /tmp/models && tar -xJf bin/calib.tar.xz -C "$bin"
[[ -f out/mid.tar.xz ]] && tar -xJf out/mid.tar.xz -C /tmp/models
("$bin/qpack" synth $work/s7 --vocab 2048 --calib-ids 262144 >/dev/null && cat $work/s7/*.safetensors >/dev/null) >"$OUT/synth.log" 2>&1 &
synth=$!
for m in ${QPACK_MID_MATH-tf32 bf16}; do
	"$bin/qpack" convert /tmp/models/mid-llama -o /tmp/ml-$m --device cuda --method gptq --calib out/calib.txt --calib-math $m --overwrite >"$OUT/ml-$m.log" 2>&1
	echo "mid-llama gptq $m rc $?: $(grep -E '^gptq on' "$OUT/ml-$m.log" | cut -c1-120)"
	"$bin/qpack" eval /tmp/ml-$m --data /tmp/models/mid-llama/heldout_ids.npy --device cuda -q 2>&1 | tail -1
done
wait $synth
ids="--calib $work/s7/calib_ids.npy"
run() { # name, args...
	local name=$1
	shift
	/usr/bin/time -f "$name: %e s wall" timeout 200 "$bin/qpack" convert $work/s7 --device cuda --overwrite --input-hash none "$@" >"$OUT/$name.log" 2>&1
	grep -E '^(gptq|awq|awq\+gptq) on|^plan:.*(statistics|probe).* s$|wall' "$OUT/$name.log" | cut -c1-400
}
for m in tf32 bf16; do run 7b-gptq-$m -o $work/g --method gptq $ids --calib-samples 128 --calib-seqlen 2048 --calib-math $m; done
run 7b-awqgptq-bf16 -o $work/a --method awq+gptq $ids --calib-samples 128 --calib-seqlen 512 --calib-math bf16
run 7b-budget -o $work/b --format qpack --method gptq --strategy budget --target-bpw 3.5 $ids --calib-samples 128 --calib-seqlen 512 --calib-math bf16 \
	--ladder int2-g64-asym,int3-g128-asym,int4-g128-asym,int8-g128-asym
