#!/usr/bin/env bash
# The torch decoder's device check (issue 66), one run on a CUDA machine, from the repo root:
#   OUT=/some/dir bash tests/gpu_forward_check.sh
# Installs the project (no network: --no-deps), runs the CUDA tests (the Triton kernels, every drafter lossless,
# the torch decoder and its CUDA graphs), then `specchat bench gpu-forward` at Llama-3.1-8B shapes; everything
# lands in $OUT (env.txt, pytest.txt, gpu_forward.json, bench.err). About 5 minutes on an H200.
set -u
OUT=${OUT:-/tmp/gpu_forward_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q -e . --no-deps --no-build-isolation >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    date -u +%FT%TZ
} | tee "$OUT/env.txt"
SECONDS=0
timeout 200 python3 -m pytest -q -n 6 -p no:cacheprovider tests/test_torch_decoder.py tests/test_decoder_kernels.py \
    tests/test_kernels_triton.py tests/test_cuda.py >"$OUT/pytest.txt" 2>&1
echo "pytest rc $? in ${SECONDS}s"
tail -25 "$OUT/pytest.txt"
SECONDS=0
timeout 240 python3 -m specchat bench gpu-forward --context 4096,32768 --tree 1,15,63,64 --json \
    >"$OUT/gpu_forward.json" 2>"$OUT/bench.err"
echo "bench rc $? in ${SECONDS}s"
tail -5 "$OUT/bench.err"
cat "$OUT/gpu_forward.json"
