#!/bin/bash
# Several GPUs in one call (bin/gpu.tar.xz carried, scripts/gpu-pack.sh): the tests of sharded
# calibration, then a synthetic Llama-2-7B through GPTQ 128 × 2048 on 1, 2 and all GPUs
# (--devices), the outputs compared byte by byte; mid-llama (out/mid.tar.xz carried, out/calib.txt)
# through GPTQ on 1, 2 and all GPUs, each evaluated. QPACK_BUDGET: seconds this may take (540).
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT"
root=$PWD start=$(date +%s) work=${QPACK_WORK:-/tmp/qpack-7b}
left() { echo $((${QPACK_BUDGET:-540} - ($(date +%s) - start))); }
tar -xJf ${QPACK_TAR:-bin/gpu.tar.xz} -C bin
B=$root/bin/gpu
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m | head -6; df -h /dev/shm /tmp | tail -2; free -g | head -2
gpus=$(nvidia-smi -L | wc -l)
mkdir -p $work
("$B/qpack" synth $work/s7 --vocab 2048 --calib-ids 262144 >/dev/null && cp testdata/models/tiny/tokenizer.json $work/s7/ &&
	cat $work/s7/*.safetensors >/dev/null) >"$OUT/synth.log" 2>&1 &
synth=$!
runtests() { # package, pattern
	(cd "$root/$1" && timeout 200 "$B/$1.test" -test.run "$2" -test.v -test.count=1 >"$OUT/test-$1.log" 2>&1)
	echo "test $1 ($2): rc $?, $(grep -c '^\s*--- PASS' "$OUT/test-$1.log") passed, $(grep -c '^\s*--- FAIL' "$OUT/test-$1.log") failed, $(grep -c '^\s*--- SKIP' "$OUT/test-$1.log") skipped"
	grep -E '^\s*--- FAIL|^panic|_test.go:[0-9]+: ' "$OUT/test-$1.log" | grep -v -- '--- PASS' | head -${QPACK_FAIL_LINES:-8} | cut -c1-300
}
runtests model "${QPACK_MODEL_TESTS:-Sharded|GPUCalibrate|Staged}"
runtests convert "${QPACK_CONVERT_TESTS:-SeveralGPUs|GPUCPUSolved|GPUAWQ}"
if [[ -f out/mid.tar.xz ]]; then
	mkdir -p /tmp/models && tar -xJf out/mid.tar.xz -C /tmp/models
	for d in 0 0,1 $(seq -s, 0 $((gpus - 1))); do
		"$B/qpack" convert /tmp/models/mid-llama -o /tmp/ml-$d --device cuda --devices $d --method gptq --calib out/calib.txt --overwrite >"$OUT/ml-$d.log" 2>&1
		echo "mid-llama gptq --devices $d rc $?: $(grep -E '^gptq on' "$OUT/ml-$d.log" | cut -c1-60) $("$B/qpack" eval /tmp/ml-$d --data /tmp/models/mid-llama/heldout_ids.npy --device cuda -q 2>&1 | tail -1)"
	done
fi
wait $synth
echo "after tests: $(left) s left"
conv() { # name, seconds, args...
	local name=$1 t=$2
	shift 2
	[[ $(left) -gt $((t + 20)) ]] || { echo "$name: skipped, $(left) s left"; return 1; }
	/usr/bin/time -f "$name: %e s wall" timeout "$t" "$B/qpack" convert $work/s7 --device cuda --overwrite "$@" >"$OUT/$name.log" 2>&1
	grep -E '^(gptq|awq\+gptq) on|wall|quantizing on|rror' "$OUT/$name.log" | cut -c1-400
}
ids="--calib $work/s7/calib_ids.npy --calib-samples 128 --calib-seqlen 2048"
all=$(seq -s, 0 $((gpus - 1)))
for d in 0 0,1 $all; do
	n=$(echo $d | tr , '\n' | wc -l)
	conv gptq-$n ${QPACK_T:-80} -o $work/g$n --method gptq $ids --devices $d ${QPACK_MATH:-} || break
done
for n in 2 $gpus; do
	[[ -d $work/g$n && -d $work/g1 ]] || continue
	for f in $(cd $work/g1 && ls *.safetensors); do
		echo "1 vs $n GPUs, $f: $(cmp -l $work/g1/$f $work/g$n/$f | wc -l) of $(stat -c %s $work/g1/$f) bytes differ"
	done
done
echo "done, $(left) s left"
