"""Interleaved A/B of CPU decoder builds: 28 layers with the 1.5B's attention shapes (12 q heads, 2 kv, D 128)
and tiny matmuls, its KV cache at `context` (DRAM-resident, as in the model); ms per step, median, and the
largest output difference between builds. Each build is named by its source version (`source_version()` of
that checkout, built once by `cpu_decoder()`); `dtype=bfloat16` holds the weights and cache in bf16, as the 1.5B
runs: `python scripts/attention_ab.py 16384 5 before=4e7c530d223d after=<version> [dtype=bfloat16]`. With
`prefill=1` the rows are a prompt's: `context` causal rows from an empty cache, one forward each build. A
version written `<version>+int8` runs that build on an int8 cache (random codes and scales) instead."""
import glob
import importlib.util
import statistics
import sys
import time

import torch
from torch.utils.cpp_extension import get_default_build_root

builds, int8, dt, prefill = {}, set(), torch.float32, False
for name_hash in sys.argv[3:]:
    name, h = name_hash.split("=")
    if name == "dtype":
        dt = getattr(torch, h)
        continue
    if name == "prefill":
        prefill = h == "1"
        continue
    if h.endswith("+int8"):
        h = h.removesuffix("+int8")
        int8.add(name)
    path = glob.glob(f"{get_default_build_root()}/specchat_cpu_decoder_{h}/*.so")[0]
    spec = importlib.util.spec_from_file_location(f"specchat_cpu_decoder_{h}", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); builds[name] = mod
context, reps = int(sys.argv[1]), int(sys.argv[2])
H, KV, D, HID, INTER, L = 12, 2, 128, 256, 64, 28
torch.manual_seed(0)
weights = [tuple(w.to(dt) for w in (torch.randn((H + 2 * KV) * D, HID) * 0.05, torch.randn(HID, H * D) * 0.05,
                                    torch.randn(2 * INTER, HID) * 0.05, torch.randn(HID, INTER) * 0.05))
           for _ in range(L)]
def decoder(native):
    d = lambda w: native.Projection([native.Linear.dense(w, None)])
    layers = [native.Layer(d(a), d(b), d(c), d(e), torch.ones(HID, dtype=dt), torch.ones(HID, dtype=dt))
              for a, b, c, e in weights]
    return native.Decoder(layers, torch.ones(HID, dtype=dt), H, KV, D, INTER, 1e-6, D ** -0.5)
decoders = {name: decoder(native) for name, native in builds.items()}
keys = [torch.randn(KV, context + 16, D, dtype=dt) for _ in range(L)]
values = [torch.randn(KV, context + 16, D, dtype=dt) for _ in range(L)]
int8_keys = [torch.randint(1, 256, (KV, context + 16, D), dtype=torch.uint8) for _ in range(L)]
int8_values = [torch.randint(-127, 128, (KV, context + 16, D), dtype=torch.int8) for _ in range(L)]
int8_scales = [torch.rand(KV, (context + 16) // 16, D // 32 + 1, 16) * 0.02 for _ in range(L)]
caches = {name: (int8_keys, int8_values, int8_scales) if name in int8 else (keys, values, None) for name in builds}
ROWS = (context,) if prefill else (1, 4, 8, 16)
prefix = 0 if prefill else context
times = {(name, rows): [] for name in builds for rows in ROWS}
inputs = {rows: (torch.randn(rows, HID, dtype=dt), torch.ones(rows, D), torch.zeros(rows, D),
                 None if rows == 1 or prefill else torch.tril(torch.ones(rows, rows, dtype=torch.bool)))
          for rows in ROWS}
outs = {}
for _ in range(reps):
    for name, native in builds.items():
        for rows, (x, cos, sin, mask) in inputs.items():
            t = time.perf_counter(); out = native.forward(decoders[name], x, cos, sin, *caches[name][:2], prefix, mask,
                                                          True, *(caches[name][2:] if name in int8 else ()))
            times[(name, rows)].append(time.perf_counter() - t); outs[(name, rows)] = out[0]
for rows in ROWS:
    print(f"context {prefix}, {rows} rows: "
          + ", ".join(f"{name} {statistics.median(times[(name, rows)]) * 1e3:.1f} ms" for name in builds))
ref = next(iter(builds))
for name in builds:
    print(name, "max diff vs", ref,
          max((outs[(name, r)].float() - outs[(ref, r)].float()).abs().max().item() for r in ROWS))
