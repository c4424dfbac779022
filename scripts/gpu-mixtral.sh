#!/bin/bash
# Issue 24's GPU floor, on a GPU machine, from the repository root: a synthetic Mixtral-8x7B
# (32 blocks, hidden 4096, 8 experts of MLP 14336, top-2; 46.7 B parameters, 93 GB of BF16) written
# by qpack synth with 262,144 random calibration ids, then GPTQ int4-g128 of every expert with
# 128 × 2048 calibration tokens on one GPU: wall time, host memory and peak GPU memory (the
# "gptq on …" line; the floor is ≤ 40 GB).
# Usage: scripts/gpu-mixtral.sh QPACK_BINARY [WORK_DIR]
#   WORK_DIR needs about 120 GB free (the model, then the 25 GB output). Run the two steps as two
#   commands when one must stay under 10 minutes: QPACK_STEP=synth, then QPACK_STEP=convert.
set -euo pipefail
qpack=$1 work=${2:-/tmp/qpack-mixtral}
mkdir -p "$work"
if [[ ${QPACK_STEP:-synth} == synth ]]; then
	if [[ ! -f $work/mixtral/config.json ]]; then
		/usr/bin/time -f "synth: %e s wall, %M KB max RSS" "$qpack" synth "$work/mixtral" --layers 32 --hidden 4096 \
		  --intermediate 14336 --heads 32 --kv-heads 8 --vocab 32000 --experts 8 --experts-per-token 2 --calib-ids 262144
	fi
	du -sh "$work/mixtral"
	cat "$work"/mixtral/*.safetensors >/dev/null # page-cached, as the 7B numbers were measured
fi
if [[ ${QPACK_STEP:-convert} == convert ]]; then
	export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} # one GPU
	rm -rf "$work/gptq"
	/usr/bin/time -f "convert: %e s wall, %M KB max RSS" "$qpack" convert "$work/mixtral" -o "$work/gptq" --device cuda \
	  --method gptq --calib "$work/mixtral/calib_ids.npy" --calib-samples 128 --calib-seqlen 2048 --input-hash none \
	  --report "$work/gptq.json" >"$work/gptq.log" 2>&1 || { tail -20 "$work/gptq.log"; exit 1; }
	grep -E '^gptq on |^time:|^wrote|^convert: .* wall' "$work/gptq.log"
	grep -E '^gptq block (0|31): ' "$work/gptq.log"
	rm -rf "$work/gptq"
fi
