#!/bin/bash
# The 7B-scale measurements of the README's GPU table, on a GPU machine, from the repository root:
# a synthetic Llama-2-7B, its read bandwidth, RTN on the GPU with its breakdown, and GPTQ end to end
# with 128 × 2048 calibration tokens.
# Usage: scripts/gpu-7b.sh QPACK_BINARY CALIB_IDS.npy [WORK_DIR]
#   CALIB_IDS.npy: at least 262,144 token ids below 32,000 (int32 or int64 .npy); any text with a
#   tokenizer.json would do for a real model, the synthetic one has no tokenizer.
set -euo pipefail
qpack=$1 calib=$2 work=${3:-/tmp/qpack-7b}
mkdir -p "$work"
[[ -f $work/syn7b/config.json ]] || "$qpack" synth "$work/syn7b" >/dev/null
cat "$work"/syn7b/*.safetensors >/dev/null # page-cached, as in the README's numbers
"$qpack" bench read "$work/syn7b"
"$qpack" bench read "$work/syn7b"
# RTN three times: the page cache and the disk's writeback vary between runs. The first run on a
# machine also compiles the PTX for its GPU (about 4 s; the driver caches the result).
for run in 1 2 3; do
	sync
	"$qpack" convert "$work/syn7b" -o "$work/rtn" --device cuda --method rtn --overwrite --report "$work/rtn$run.json" 2>&1 | tail -2
	rm -rf "$work/rtn"
done
sync # the same, flushed to disk before the rename
"$qpack" convert "$work/syn7b" -o "$work/rtn" --device cuda --method rtn --sync --overwrite --report "$work/rtn-sync.json" 2>&1 | tail -2
rm -rf "$work/rtn"
"$qpack" bench read "$work/syn7b"
/usr/bin/time -f "%e s wall, %M KB max RSS" "$qpack" convert "$work/syn7b" -o "$work/gptq" --device cuda --method gptq \
  --calib "$calib" --calib-samples 128 --calib-seqlen 2048 --overwrite --report "$work/gptq.json" >"$work/gptq.log" 2>&1
grep -v '^\[' "$work/gptq.log" | grep -v '^gptq model' | grep -v '^convert: ' | tail -4
rm -rf "$work/gptq"
# AWQ end to end on the GPU with 128 × 512 calibration tokens (opt in: QPACK_7B_AWQ=1); its
# "awq on cuda" log line gives the phases (scale search, clipping search, quantization, forward
# passes and the rest).
if [[ ${QPACK_7B_AWQ:-} == 1 ]]; then
	/usr/bin/time -f "%e s wall, %M KB max RSS" "$qpack" convert "$work/syn7b" -o "$work/awq" --device cuda --method awq --scheme int4-g128-asym \
	  --format awq --calib "$calib" --calib-samples 128 --calib-seqlen 512 --overwrite --report "$work/awq.json" >"$work/awq.log" 2>&1
	grep '^awq on\|^time:\|wall' "$work/awq.log" | tail -4
	rm -rf "$work/awq"
fi
