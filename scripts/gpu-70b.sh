#!/bin/bash
# The whole Llama-2-70B-shaped model (80 layers, hidden 8192, MLP 28672, 64 heads, 8 KV heads) through
# GPTQ int4-g128 with 128 × 2048 tokens, qpack carried as bin/q.tar.xz (see gpu-scale.sh). The model is
# synthesized into /dev/shm once (about 137 GB) and kept there for a later call on the same machine.
# QPACK_70B: the --devices lists to run, in order (default: every GPU); QPACK_BUDGET: seconds this may
# take (570). A run cut short by the budget still reports how many tensors it had written by then.
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT" bin/q
root=$PWD start=$(date +%s)
left() { echo $((${QPACK_BUDGET:-570} - ($(date +%s) - start))); }
tar -xJf bin/q.tar.xz -C bin/q
Q=$root/bin/q/qpack
gpus=$(nvidia-smi -L | wc -l)
all=$(seq -s, 0 $((gpus - 1)))
work=/dev/shm/qpack
df -h /dev/shm | tail -1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c
mkdir -p $work
m=$work/w70-80
if ! grep -q '"num_hidden_layers": 80' $m/config.json 2>/dev/null || [[ ! -f $m/tokenizer.json ]]; then
	rm -rf $work/w70* $work/out-*
	/usr/bin/time -f "synth 70B-shaped, 80 layers: %e s, %M KB max resident" "$Q" synth $m --layers 80 --hidden 8192 --intermediate 28672 \
		--heads 64 --kv-heads 8 --vocab 32000 --calib-ids 262144 >/dev/null 2>"$OUT/synth.log"
	tail -1 "$OUT/synth.log"
	cp testdata/models/tiny/tokenizer.json $m/
else
	echo "70B-shaped model kept from an earlier call"
fi
du -sh $m | cut -f1
for d in ${QPACK_70B:-$all}; do
	n=$(echo $d | tr , '\n' | wc -l)
	t=$(($(left) - 15))
	[[ $t -gt 60 ]] || { echo "70b-$n: skipped, $(left) s left"; break; }
	rm -rf $work/out-*
	/usr/bin/time -f "70b-$n: %e s wall, %M KB max resident" timeout "$t" "$Q" convert $m --device cuda --devices $d --overwrite \
		-o $work/out-70b-$n --method gptq --calib $m/calib_ids.npy --calib-samples 128 --calib-seqlen 2048 >"$OUT/70b-$n.log" 2>&1
	echo "70b-$n (--devices $d, limit $t s): rc $?"
	grep -E '^gptq on|wall|^qpack: |panic' "$OUT/70b-$n.log" | cut -c1-600
	tr '\r' '\n' <"$OUT/70b-$n.log" | grep -E 'tensors' | tail -1 | cut -c1-200
	du -sh $work/out-70b-$n 2>/dev/null | cut -f1
done
echo "done, $(left) s left"
