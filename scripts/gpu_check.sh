#!/usr/bin/env bash
# The GPU device check, one run on a CUDA machine, from the repo root:
#   OUT=/some/dir bash scripts/gpu_check.sh
# Installs the project (no network: --no-deps), runs the CUDA tests (the Triton kernels, every drafter lossless
# through the engine's torch decoder and its CUDA graphs), then at Llama-3.1-8B shapes with random bf16 weights
# `specchat bench gpu-forward` (decode and verification, graphs against calls), `specchat bench oracle` (end to
# end at tau 1 and 4 against our own graph AR; then at the adaptive budget, calibrated on the GPU as a user's run
# is) and `specchat bench draft` (a random LongSpec draft's proposal against the decode step), and
# `scripts/gpu_row_invariance.py` (is a verified row bitwise the decode step: cuBLAS products by row count, tree
# attention); before the benches, the tree attention's K/V reads, pointers against tensor descriptors, and its body
# splits a row, 16 / 32 / 64 (`scripts/cuda_launch_gap.py reads`, `splits`), TokenSwift's tree laid out on the
# device against on the host (`scripts/cuda_tree_layout.py`), EAGLE-3's proposal at 8B shapes as called against its
# graph (`scripts/cuda_eagle3_draft.py`); everything lands in $OUT, ten files at
# most (env.txt, install.log, pytest.txt, reads.txt, gpu_forward.json, oracle.json, oracle_auto.json, draft.json,
# rows.json, bench.err). About 6 minutes on an H200.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q -e . --no-deps --no-build-isolation >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    git rev-parse --short HEAD 2>/dev/null
    date -u +%FT%TZ
} | tee "$OUT/env.txt"
SECONDS=0
TESTS=(-o cache_dir=/tmp/gpu_check_pytest tests/test_torch_decoder.py tests/test_decoder_kernels.py
    tests/test_kernels_triton.py tests/test_cuda.py)
timeout 200 python3 -m pytest -q -n 6 "${TESTS[@]}" >"$OUT/pytest.txt" 2>&1
status=$?
echo "pytest rc $status in ${SECONDS}s"
if [ "$status" -ne 0 ]; then  # the failures once more, one at a time: flaky or not
    timeout 90 python3 -m pytest -q --last-failed "${TESTS[@]}" >>"$OUT/pytest.txt" 2>&1
    echo "rerun of the failures rc $?"
fi
tail -25 "$OUT/pytest.txt"
SECONDS=0
timeout 90 python3 scripts/cuda_launch_gap.py reads >"$OUT/reads.txt" 2>>"$OUT/bench.err"
echo "reads rc $? in ${SECONDS}s"
SECONDS=0
timeout 60 python3 scripts/cuda_launch_gap.py splits >>"$OUT/reads.txt" 2>>"$OUT/bench.err"
echo "splits rc $? in ${SECONDS}s"
SECONDS=0
timeout 60 python3 scripts/cuda_tree_layout.py >>"$OUT/reads.txt" 2>>"$OUT/bench.err"
echo "tree layout rc $? in ${SECONDS}s"
SECONDS=0
timeout 60 python3 scripts/cuda_eagle3_draft.py >>"$OUT/reads.txt" 2>>"$OUT/bench.err"
echo "eagle3 draft rc $? in ${SECONDS}s"
cat "$OUT/reads.txt"
SECONDS=0
timeout 150 python3 -m specchat bench gpu-forward --context 4096,32768 --tree 1,15,63,64 --json \
    >"$OUT/gpu_forward.json" 2>>"$OUT/bench.err"
echo "gpu-forward rc $? in ${SECONDS}s"
cat "$OUT/gpu_forward.json"
SECONDS=0
timeout 120 python3 -m specchat bench oracle --context 4096 --tokens 384 --acceptance 0,0.8,1 --budget 3 --repeats 1 \
    --json >"$OUT/oracle.json" 2>>"$OUT/bench.err"
echo "oracle rc $? in ${SECONDS}s"
cat "$OUT/oracle.json"
SECONDS=0
timeout 150 python3 -m specchat bench oracle --context 4096 --tokens 384 --acceptance 0,0.8 --budget auto --repeats 1 \
    --json >"$OUT/oracle_auto.json" 2>>"$OUT/bench.err"
echo "oracle at the adaptive budget rc $? in ${SECONDS}s"
cat "$OUT/oracle_auto.json"
SECONDS=0
timeout 120 python3 -m specchat bench draft --shapes llama3.1-8b --dtype bfloat16 --context 4096,32768 \
    --vocab 0,32768 --budget 15,63 --json >"$OUT/draft.json" 2>>"$OUT/bench.err"
echo "draft rc $? in ${SECONDS}s"
cat "$OUT/draft.json"
SECONDS=0
timeout 120 python3 scripts/gpu_row_invariance.py >"$OUT/rows.json" 2>>"$OUT/bench.err"
echo "rows rc $? in ${SECONDS}s"
cat "$OUT/rows.json"
tail -20 "$OUT/bench.err"
