#!/usr/bin/env bash
# Quality table: converts small-llama with several methods/plans and evaluates each on the
# held-out ids (64 × 512 tokens, the protocol of the shared models' reference.json).
# Usage: scripts/quality.sh QPACK_BINARY MODELS_DIR OUT_DIR [SET...]
#   MODELS_DIR holds small-llama/ and calib.txt; SETs: rtn, budget, gptq, gptq-budget, frontier
#   (default: rtn budget). frontier: GPTQ --imatrix budget plans at 2.7, 3.5, 4.2, 4.5 and 5.0 bits/weight
#   over the ladder $FRONTIER_LADDER (default: integer rungs), all at once (one CPU solver each);
#   $FRONTIER_FLAGS are added to each conversion, $FRONTIER_TAG to each row's name.
#   ONLY=REGEX runs only the rows whose names match (and skips the reference evaluation).
set -euo pipefail
qpack=$1 models=$2 out=$3
shift 3
sets=${*:-rtn budget}
src=$models/small-llama
data=$src/heldout_ids.npy
mkdir -p "$out"
ladder=int2-g64-asym,int3-g128-asym,int3-g64-asym,int4-g128-asym,int4-g64-asym,int8-g128-asym
gptq=(--method gptq --calib "$models/calib.txt" --calib-samples 128 --calib-seqlen 512 --no-true-sequential)
alloc=(--calib "$models/calib.txt" --calib-samples "${CALIB_SAMPLES:-32}" --format qpack --ladder "$ladder")
row() { # name, then convert flags; ONLY='regex' runs just the matching rows
  local name=$1; shift
  if [[ -n "${ONLY:-}" && ! $name =~ $ONLY ]]; then return 0; fi
  "$qpack" convert "$src" -o "$out/$name" --overwrite -q --report "$out/$name.report.json" "$@" > "$out/$name.convert.txt" 2>&1
  "$qpack" eval "$out/$name" --data "$data" --json > "$out/$name.eval.json"
  printf '%-30s bpw %6.3f  ppl %8.3f  (%s)\n' "$name" \
    "$(grep -m1 '"quantized_bpw"' "$out/$name.report.json" | tr -dc '0-9.')" \
    "$(grep -m1 '"perplexity"' "$out/$name.eval.json" | tr -dc '0-9.')" "$*" | tee -a "$out/table.txt"
  rm -rf "${out:?}/$name"
}
[[ -n "${ONLY:-}" ]] || "$qpack" eval "$src" --data "$data" --json > "$out/reference.eval.json"
[[ -n "${ONLY:-}" ]] || echo "reference ppl $(grep -m1 '"perplexity"' "$out/reference.eval.json" | tr -dc '0-9.')" | tee -a "$out/table.txt"
for set in $sets; do
  case $set in
  rtn)
    row rtn-int4-g128-asym --scheme int4-g128-asym
    row rtn-int4-g128-sym --scheme int4-g128-sym
    row rtn-int3-g128-asym --scheme int3-g128-asym
    row rtn-int2-g64-asym --scheme int2-g64-asym
    row rtn-int4-g128-asym-clip --scheme int4-g128-asym --clip
    row rtn-nf4-g64 --scheme nf4-g64 --format qpack ;;
  budget)
    for bpw in 3.0 3.5 4.0 4.5; do row "rtn-budget-$bpw" --strategy budget --target-bpw "$bpw" "${alloc[@]}"; done
    row rtn-evolved --strategy evolved "${alloc[@]}" --ladder int4-g128-asym,int8-g128-asym ;;
  gptq)
    row gptq-int4-g128-asym --scheme int4-g128-asym "${gptq[@]}"
    row gptq-int4-g128-asym-actorder --scheme int4-g128-asym --act-order "${gptq[@]}"
    row gptq-int4-g128-sym --scheme int4-g128-sym "${gptq[@]}"
    row gptq-int3-g128-asym --scheme int3-g128-asym "${gptq[@]}"
    row gptq-int2-g64-asym --scheme int2-g64-asym "${gptq[@]}" ;;
  frontier)
    fl=${FRONTIER_LADDER:-int2-g64-asym,int2-g32-asym,int3-g128-asym,int3-g64-asym,int3-g32-asym,int4-g128-asym,int4-g64-asym,int4-g32-asym,int8-g128-asym}
    for bpw in ${FRONTIER_BPW:-2.7 3.5 4.2 4.5 5.0}; do
      row "gptq-imatrix-budget-$bpw${FRONTIER_TAG:-}" --method gptq --calib "$models/calib.txt" --calib-samples 128 --calib-seqlen 512 \
        --imatrix --strategy budget --target-bpw "$bpw" --format qpack --ladder "$fl" ${FRONTIER_FLAGS:-} &
    done
    wait ;;
  gptq-budget)
    for bpw in 3.0 3.5 4.0 4.5; do row "gptq-budget-$bpw" --strategy budget --target-bpw "$bpw" "${alloc[@]}" "${gptq[@]}"; done
    row gptq-evolved --strategy evolved "${alloc[@]}" --ladder int4-g128-asym,int8-g128-asym "${gptq[@]}" ;;
  *) echo "unknown set $set" >&2; exit 2 ;;
  esac
done
