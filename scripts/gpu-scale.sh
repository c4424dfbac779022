#!/bin/bash
# GPTQ across GPU counts in one call, qpack alone carried (bin/q.tar.xz: CGO_ENABLED=0 go build -o
# bin/q/qpack ./cmd/qpack && tar -cJf bin/q.tar.xz -C bin/q qpack), with out/mid.tar.xz and
# out/calib.txt: mid-llama through GPTQ on 1, 2 and all GPUs, each evaluated; a synthetic
# Llama-2-7B through GPTQ 128 × 2048 on 1, 2 and all GPUs (a --trace timeline of each); a
# Llama-2-70B-shaped model of QPACK_70B_LAYERS layers (4; 0: none) on all GPUs and on one (QPACK_7B and
# QPACK_70B list other --devices, each optionally :MATH for --calib-math (QPACK_70B: :base only); QPACK_MID_MATH lists the
# --calib-math of mid-llama's one-GPU runs, QPACK_MID_METHOD their --method, gptq by default). Models live
# in /dev/shm (made once: later runs of the script in the same call reuse them, whatever QPACK_70B_LAYERS); each 7B run
# with a baseline run of the same name is compared with it, tensor bytes. QPACK_BUDGET: seconds this may
# take (540).
set -u
OUT=${OUT:-/tmp/qpack-gpu-out}
mkdir -p "$OUT" bin/q
root=$PWD start=$(date +%s) work=/dev/shm/qpack
left() { echo $((${QPACK_BUDGET:-540} - ($(date +%s) - start))); }
tar -xJf bin/q.tar.xz -C bin/q
Q=$root/bin/q/qpack Q0=$Q
if [[ -f bin/q0.tar.xz ]]; then # a baseline build: entries ending in :base run it, in the same call
	mkdir -p bin/q0 && tar -xJf bin/q0.tar.xz -C bin/q0 && Q0=$root/bin/q0/qpack
fi
gpus=$(nvidia-smi -L | wc -l)
all=$(seq -s, 0 $((gpus - 1)))
mkdir -p $work
({ [[ -f $work/s7/tokenizer.json ]] || { /usr/bin/time -f "synth 7B: %e s" "$Q" synth $work/s7 --vocab 2048 --calib-ids 262144 >/dev/null &&
	cp testdata/models/tiny/tokenizer.json $work/s7/; }; } &&
	{ [[ ${QPACK_70B_LAYERS:-4} == 0 || -f $work/w70/tokenizer.json ]] || { /usr/bin/time -f "synth 70B-shaped: %e s" "$Q" synth $work/w70 --layers ${QPACK_70B_LAYERS:-4} --hidden 8192 --intermediate 28672 --heads 64 --kv-heads 8 --vocab 32000 --calib-ids 262144 >/dev/null &&
		cp testdata/models/tiny/tokenizer.json $work/w70/; }; }) >"$OUT/synth.log" 2>&1 &
synth=$!
if [[ -f out/mid.tar.xz ]]; then
	mkdir -p /tmp/models && tar -xJf out/mid.tar.xz -C /tmp/models
	runs="$(for m in ${QPACK_MID_MATH:-tf32}; do echo 0:$m; done)"
	[[ $gpus -gt 1 ]] && runs="$runs 0,1:tf32 $all:tf32"
	for e in $(echo $runs | tr ' ' '\n' | awk '!seen[$0]++'); do
		d=${e%%:*} m=${e#*:}
		"$Q" convert /tmp/models/mid-llama -o /tmp/ml-$d --device cuda --devices $d --calib-math $m --method ${QPACK_MID_METHOD:-gptq} --calib out/calib.txt --overwrite >"$OUT/ml-$d-$m.log" 2>&1
		echo "mid-llama ${QPACK_MID_METHOD:-gptq} --devices $d --calib-math $m rc $?: $(grep -E '^(gptq|awq) on' "$OUT/ml-$d-$m.log" | cut -c1-60 | tr '\n' ' ') $("$Q" eval /tmp/ml-$d --data /tmp/models/mid-llama/heldout_ids.npy --device cuda -q 2>&1 | tail -1)"
	done
fi
wait $synth
cat "$OUT/synth.log"
conv() { # name, seconds, model, qpack's own flags, convert's flags... (the baseline's qpack for a name ending in -base)
	local name=$1 t=$2 m=$3 app=$4 q=$Q
	shift 4
	[[ $name == *-base ]] && q=$Q0
	[[ $(left) -gt $((t + 10)) ]] || { echo "$name: skipped, $(left) s left"; return 1; }
	rm -rf $work/out-$name # an earlier run's output: --overwrite's removal of it is not the conversion's time
	/usr/bin/time -f "$name: %e s wall, %M KB max resident" timeout "$t" "$q" $app convert $work/$m --device cuda --overwrite -o $work/out-$name --method gptq \
		--calib $work/$m/calib_ids.npy --calib-samples 128 --calib-seqlen 2048 ${QPACK_ARGS:-} "$@" >"$OUT/$name.log" 2>&1
	grep -E '^(gptq|awq|awq\+gptq) on|^plan:.*(statistics|probe).* s$|wall|^qpack: |panic' "$OUT/$name.log" | cut -c1-420
}
[[ ${QPACK_7B:-} == none ]] && QPACK_7B=" " # none: no GPTQ runs of the 7B (only QPACK_7B_OTHER's)
for e in ${QPACK_7B:-0 0,1 $all}; do # GPU lists for the 7B (DEVICES[:MATH[:base]]), then for the 70B-shaped model
	d=${e%%:*} m=fp16 b= # the default
	[[ $e == *:base ]] && b=-base e=${e%:base}
	[[ $e == *:* ]] && m=${e#*:}
	n=$(echo $d | tr , '\n' | wc -l)
	app= # no CPU profile: writing it adds to the wall time
	[[ -z $b ]] && app="--trace $OUT/7b-$n-$m.trace.json" # the timeline (a baseline build may not have --trace)
	conv 7b-$n-$m$b 80 s7 "$app" --devices $d --calib-math $m || break
done
for e in ${QPACK_7B_OTHER:-}; do # awqgptq:MATH[:DEVICES][:base] (128 × 512) or budget:MATH[:DEVICES][:base] (plan 3.5 bpw + GPTQ, 128 × 512); DEVICES 0 by default, e.g. 0-1-2-3
	b=
	[[ $e == *:base ]] && b=-base e=${e%:base}
	IFS=: read kind m d <<<"$e"
	d=${d:-0} && d=${d//-/,}
	n=$(echo $d | tr , '\n' | wc -l)
	case $kind in
	awqgptq) conv 7b-awqgptq-$m-$n$b 80 s7 "" --devices $d --calib-math $m --method awq+gptq --calib-seqlen 512 ;;
	budget) conv 7b-budget-$m-$n$b 100 s7 "" --devices $d --calib-math $m --calib-seqlen 512 --format qpack --strategy budget --target-bpw 3.5 \
		--ladder int2-g64-asym,int3-g128-asym,int4-g128-asym,int8-g128-asym ;;
	esac
done
for a in $work/out-7b-*; do # the same tensors as the baseline build's last run of that name?
	[[ $a != *-base && -d $a-base ]] || continue
	python3 - "$a" "$a-base" <<'PY'
import hashlib, os, struct, sys
def tensors(path):  # a safetensors file past its header (whose metadata names the build)
    with open(path, 'rb') as f:
        f.seek(8 + struct.unpack('<Q', f.read(8))[0])
        return hashlib.sha256(f.read()).hexdigest()
a, b = sys.argv[1:]
files = sorted(n for n in os.listdir(a) if n.endswith('.safetensors'))
same = all(os.path.exists(os.path.join(b, n)) and tensors(os.path.join(a, n)) == tensors(os.path.join(b, n)) for n in files)
print('%s: tensor bytes of its %d files %s the baseline\'s' % (os.path.basename(a)[4:], len(files), 'equal' if same else 'differ from'))
PY
done
rm -rf $work/out-7b-*
[[ ${QPACK_70B_LAYERS:-4} == 0 ]] || for e in ${QPACK_70B:-$all 0}; do # DEVICES[:base]
	d=${e%:base} b= app=
	[[ $e == *:base ]] && b=-base
	n=$(echo $d | tr , '\n' | wc -l)
	[[ -z $b ]] && app="--trace $OUT/70b-$n.trace.json"
	conv 70b-$n$b ${QPACK_70B_T:-200} w70 "$app" --devices $d || break
done
echo "done, $(left) s left"
