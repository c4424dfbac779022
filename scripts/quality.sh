#!/usr/bin/env bash
# Quality table: converts small-llama with several methods/plans and evaluates each on the
# held-out ids (64 × 512 tokens, the protocol of the shared models' reference.json).
# Usage: scripts/quality.sh QPACK_BINARY MODELS_DIR OUT_DIR   (MODELS_DIR holds small-llama/ and calib.txt)
set -euo pipefail
qpack=$1 models=$2 out=$3
src=$models/small-llama
data=$src/heldout_ids.npy
mkdir -p "$out"
ladder=int2-g64-asym,int3-g128-asym,int3-g64-asym,int4-g128-asym,int4-g64-asym,int8-g128-asym
row() { # name, then convert flags
  local name=$1; shift
  "$qpack" convert "$src" -o "$out/$name" --overwrite -q --report "$out/$name.report.json" "$@" > "$out/$name.convert.txt"
  "$qpack" eval "$out/$name" --data "$data" --json > "$out/$name.eval.json"
  printf '%-28s bpw %6.3f  ppl %8.3f\n' "$name" \
    "$(grep -m1 '"quantized_bpw"' "$out/$name.report.json" | tr -dc '0-9.')" \
    "$(grep -m1 '"perplexity"' "$out/$name.eval.json" | tr -dc '0-9.')" | tee -a "$out/table.txt"
}
"$qpack" eval "$src" --data "$data" --json > "$out/reference.eval.json"
echo "reference ppl $(grep -m1 '"perplexity"' "$out/reference.eval.json" | tr -dc '0-9.')" | tee "$out/table.txt"
row rtn-int4-g128-asym --scheme int4-g128-asym
row rtn-int4-g128-sym --scheme int4-g128-sym
row rtn-int3-g128-asym --scheme int3-g128-asym
row rtn-int2-g64-asym --scheme int2-g64-asym
row rtn-int4-g128-asym-clip --scheme int4-g128-asym --clip
row rtn-nf4-g64 --scheme nf4-g64 --format qpack
calib=(--calib "$models/calib.txt" --calib-samples "${CALIB_SAMPLES:-32}" --format qpack --ladder "$ladder")
for bpw in 3.0 3.5 4.0 4.5; do
  row "rtn-budget-$bpw" --strategy budget --target-bpw "$bpw" "${calib[@]}"
done
row rtn-evolved --strategy evolved --calib "$models/calib.txt" --calib-samples "${CALIB_SAMPLES:-32}" --format qpack --ladder int4-g128-asym,int8-g128-asym
