"""EAGLE-3's proposal at Llama-3.1-8B's shapes (random weights; the draft layer of SGLang's release for it: an MLP
14336 wide over 32000 draft tokens) below 4K committed rows, a tree of 15 nodes from 4 depths (3 draft forwards):
its depths as called, a few hundred small kernels queued one by one, against replayed as one CUDA graph, as the
drafter replays them on a GPU. Per proposal: the host's time to queue it, and the time until the device has run
it, which is what a proposal adds to a step.
`python scripts/cuda_eagle3_draft.py` on a CUDA machine (a CPU runs it too, in fp32, without the graph).
"""

import time

import torch

from specchat.bench.verify_cost import llama31_8b_config, random_model, with_layers
from specchat.drafters.eagle3.drafter import Eagle3Drafter
from specchat.drafters.eagle3.model import Eagle3Config, Eagle3Draft
from specchat.engine.cache import TreeCache
from specchat.engine.drafter import TargetView
from specchat.engine.sampling_config import SamplingConfig

CONTEXT = 4096
BUDGET = 15


def drafter(device: torch.device) -> Eagle3Drafter:
    """The draft after a 4K-token prompt: its rows run, the newest one's output ready for the root's children."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = with_layers(llama31_8b_config(), 1)  # the target's layers are never run: its embedding is read
    target = TargetView.of(random_model(config, dtype, device, "hybrid"), TreeCache(1, CONTEXT + 80))
    torch.manual_seed(0)
    with device:
        draft = Eagle3Draft(Eagle3Config.for_target(config, intermediate=14336, draft_vocab_size=32000))
    draft.set_vocab(torch.arange(32000, device=device))
    draft = draft.to(dtype)
    drafting = Eagle3Drafter(target, draft, weights=None)
    drafting.prunes = False  # as on a GPU: every depth runs, nothing read
    ids = torch.randint(0, config.vocab_size, (CONTEXT,), generator=torch.Generator().manual_seed(0)).tolist()
    features = torch.randn(CONTEXT, 3 * config.hidden_size, device=device, dtype=dtype)
    drafting.prefill(ids, features, 0)
    return drafting


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    proposals = 200 if device.type == "cuda" else 3  # a CPU's proposal reads 1.7 GB of fp32 weights
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    drafting = drafter(device)
    print(f"{'depths':>9} {'queued ms':>9} {'run ms':>7}  ({device}, {BUDGET} nodes below {CONTEXT} rows)")
    for name, graphed in (("as called", False), ("graph", True)):
        if graphed and device.type != "cuda":
            continue
        drafting.uses_graphs = graphed
        propose = lambda: drafting.propose(BUDGET, SamplingConfig())  # noqa: E731
        with torch.inference_mode():
            for _ in range(10):
                propose().tokens
            synchronize()
            start = time.perf_counter()
            for _ in range(proposals):
                propose()
            queued = time.perf_counter() - start
            synchronize()
            run = time.perf_counter() - start
        print(f"{name:>9} {queued / proposals * 1e3:9.3f} {run / proposals * 1e3:7.3f}")


if __name__ == "__main__":
    main()
