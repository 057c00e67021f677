#!/usr/bin/env bash
# ZeRO-3's own cost on one H200: the plain loop against DeepSpeed ZeRO-3 on the same
# 12-layer Qwen2.5-7B-shaped model (full fine-tuning, micro-batch 4 x 2048), with and
# without whole-layer gathering, compilation and larger buckets. One call of ~7 minutes;
# DeepSpeed travels as wheels in .carry/ds (carry=[".carry/ds"]).
#     bash bench/z3_sweep.sh $OUT/z3
set -u
out=${1:-bench-out/z3}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site_ds \
    .carry/ds/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site_ds PYTHONUNBUFFERED=1
start=$SECONDS
common=(--layers 12 --micro-batch 4 --warmup 5 --steps 15 --case-timeout 150)
run() {  # name, then gpu_dist arguments
    local name=$1; shift
    left=$(( ${BUDGET:-540} - (SECONDS - start) ))
    (( left > 70 )) || { echo "$name: skipped, ${left}s left"; return; }
    python3 bench/gpu_dist.py --out "$out/$name" --budget "$left" "${common[@]}" "$@" \
        | grep '"case"' | sed "s/^/$name /"
}
# HF's "auto" buckets (h x h, 0.9 h x h at hidden 3584), which tunesmith also used before
hf=(--zero reduce_bucket_size=12845056 --zero stage3_prefetch_bucket_size=11560550)
run z3_per_module --cases ds_z3_full_x1 --zero stage3_module_granularity_threshold=0 "${hf[@]}"
run z3_layers --cases ds_z3_full_x1 "${hf[@]}"
run plain --cases single_full_x1
run z3_layers_compiled --cases ds_z3_full_x1 --compile-full "${hf[@]}"
run plain_compiled --cases single_full_x1 --compile-full
# tunesmith's defaults: layers whole, compiled, 5e8-element buckets
run z3_default --cases ds_z3_full_x1 --compile-full
python3 bench/zero3_report.py "$out"
