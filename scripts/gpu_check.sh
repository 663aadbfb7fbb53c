#!/usr/bin/env bash
# The GPU device check, one run on a CUDA machine, from the repo root:
#   OUT=/some/dir bash scripts/gpu_check.sh
# Installs the project (no network: --no-deps), runs the CUDA tests (the Triton kernels, every drafter lossless
# through the engine's torch decoder and its CUDA graphs), then at Llama-3.1-8B shapes with random bf16 weights
# `specchat bench gpu-forward` (decode and verification, graphs against calls), `specchat bench oracle` (end to
# end at tau 1 and 4 against our own graph AR), `scripts/gpu_row_invariance.py` (is a verified row bitwise the
# decode step: cuBLAS products by row count, tree attention), `specchat bench draft` (a random LongSpec draft's
# proposal against the decode step) and the oracle at the adaptive budget (calibrated on the GPU as a user's run
# is); last the diagnostics: the tree attention's K/V reads, pointers against tensor descriptors, and its body
# splits a row, 16 / 32 / 64 (`scripts/cuda_launch_gap.py reads`, `splits`), TokenSwift's tree laid out on the
# device against on the host (`scripts/cuda_tree_layout.py`), EAGLE-3's proposal at 8B shapes as called against
# its graph (`scripts/cuda_eagle3_draft.py`). Every step's limit is cut to what is left of $BUDGET seconds (540:
# the device runs a call for at most 600), so a slow step costs the ones after it, never the files before it;
# everything lands in $OUT, ten files at most (env.txt, install.log, pytest.txt, gpu_forward.json, oracle.json,
# rows.json, draft.json, oracle_auto.json, reads.txt, bench.err). About 6 minutes on an H200.
set -u
OUT=${OUT:-/tmp/gpu_check}
BUDGET=${BUDGET:-540}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)

# step NAME LIMIT OUTFILE COMMAND...: runs COMMAND for at most LIMIT seconds or what is left of the budget, its
# stdout appended to OUTFILE, its stderr to bench.err; says how it ended and how long it took.
step() {
    local name=$1 limit=$2 file=$3
    shift 3
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -lt 20 ]; then
        echo "$name skipped: ${left}s of the budget left"
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local began=$(date +%s)
    timeout "$limit" "$@" >>"$file" 2>>"$OUT/bench.err"
    local status=$?
    echo "$name rc $status in $(($(date +%s) - began))s (limit ${limit}s)"
    return "$status"
}

python3 -m pip install -q -e . --no-deps --no-build-isolation >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    git rev-parse --short HEAD 2>/dev/null
    date -u +%FT%TZ
} | tee "$OUT/env.txt"

TESTS=(-o cache_dir=/tmp/gpu_check_pytest tests/test_torch_decoder.py tests/test_decoder_kernels.py
    tests/test_kernels_triton.py tests/test_cuda.py)
if ! step pytest 200 "$OUT/pytest.txt" python3 -m pytest -q -n 6 "${TESTS[@]}"; then  # flaky or not: once more
    step "rerun of the failures" 90 "$OUT/pytest.txt" python3 -m pytest -q --last-failed "${TESTS[@]}"
fi
tail -25 "$OUT/pytest.txt"

step gpu-forward 150 "$OUT/gpu_forward.json" \
    python3 -m specchat bench gpu-forward --context 4096,32768 --tree 1,15,63,64 --json
cat "$OUT/gpu_forward.json"
step oracle 120 "$OUT/oracle.json" python3 -m specchat bench oracle --context 4096 --tokens 384 \
    --acceptance 0,0.8,1 --budget 3 --repeats 1 --json
cat "$OUT/oracle.json"
step rows 120 "$OUT/rows.json" python3 scripts/gpu_row_invariance.py
cat "$OUT/rows.json"
step draft 120 "$OUT/draft.json" python3 -m specchat bench draft --shapes llama3.1-8b --dtype bfloat16 \
    --context 4096,32768 --vocab 0,32768 --budget 15,63 --json
cat "$OUT/draft.json"
step "oracle at the adaptive budget" 150 "$OUT/oracle_auto.json" python3 -m specchat bench oracle --context 4096 \
    --tokens 384 --acceptance 0,0.8 --budget auto --repeats 1 --json
cat "$OUT/oracle_auto.json"

step reads 90 "$OUT/reads.txt" python3 scripts/cuda_launch_gap.py reads
step splits 60 "$OUT/reads.txt" python3 scripts/cuda_launch_gap.py splits
step "tree layout" 60 "$OUT/reads.txt" python3 scripts/cuda_tree_layout.py
step "eagle3 draft" 60 "$OUT/reads.txt" python3 scripts/cuda_eagle3_draft.py
cat "$OUT/reads.txt"
tail -20 "$OUT/bench.err"
