"""Peak RSS after loading and one answer, and verification cost by tree size (root + n chain nodes, ~263 tokens
of context unless argv[2] gives a prompt length), of the default model loaded with `--dtype` argv[1]:
`python scripts/verify_curve.py auto|float32 [TOKENS]`."""
import json
import resource
import sys

import torch

from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig
from specchat.engine.verify_cost import measure_verify_cost
from specchat.engine.verify_forward import verification_forward
from specchat.loading import load_model

dtype = sys.argv[1]
m = load_model(None, dtype=dtype, device="cpu")
length = int(sys.argv[2]) if len(sys.argv) > 2 else 300
ids = encode_prompt(m.tokenizer, "Write a short story about a lighthouse keeper. " * (25 + length // 9))[:length]
e = Engine(m.model, m.tokenizer, max_len=len(ids) + 80, drafter=NgramDrafter(), draft_budget=64)
for ev in e.generate(ids, sampling=SamplingConfig(temperature=0.0), max_new_tokens=8): pass
def verify_forward(n):  # root + a chain of n nodes at the current context, committing nothing
    return verification_forward(e._forward, e.cache, e.device, tree=n)
with torch.inference_mode():
    cost = measure_verify_cost(verify_forward, sizes=(0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64), repeats=5,
                               device=e.device)
print(json.dumps({"dtype": dtype, "weights": m.weights, "activations": m.dtype,
  "attention": m.model.config._attn_implementation,
  "context": e.cache.length, "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
  "verify_ms": {n: round(s * 1000, 1) for n, s in zip(cost.sizes, cost.seconds)}}))
