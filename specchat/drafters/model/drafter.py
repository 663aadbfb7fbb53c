"""A standalone draft model (SpecExtend; `--drafter model`, `model:HF-ID|PATH`): a small causal LM with the
target's tokenizer drafts dynamic trees from a cache of its own, of which it reads what `--draft-cache` says.

Each proposal first runs the draft over the tokens committed since the last one (the root among them, whose
distribution starts the tree), in blocks for a long prompt, appending their keys and values to its cache;
then one forward per depth of the tree (`dynamic_tree.py`). Rows attend to the working cache the policy laid
out (`cache_policy.py`: everything, sinks and recent tokens, or the chunks the target attends to most) at
compact positions, then to their own ancestors. The draft never sees the target's hidden states: it can be
any model that speaks the target's vocabulary.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.drafters import MODEL
from specchat.drafters.cache_policy import BLOCK, CachePolicy, make_policy
from specchat.drafters.draft_attention import attend
from specchat.drafters.draft_head import DraftHead, draft_weights
from specchat.drafters.draft_layers import rotate
from specchat.drafters.model.dynamic_tree import Children, grow_tree
from specchat.drafters.model.model import DraftModel, load_draft_model
from specchat.drafters.model.working_cache import WorkingCache
from specchat.drafters.tree_rows import TreeRows
from specchat.engine.drafter import DraftsAlone, TargetView, TracksCommittedIds
from specchat.engine.keyed_draws import PositionNoise
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.tree import DraftTree
from specchat.quant.quantize import quantized_copy


class ModelDrafter(DraftsAlone, TracksCommittedIds):
    kind = MODEL

    def __init__(self, target: TargetView, draft: DraftModel, *, policy: str = "retrieval",
                 weights: str | None = "auto"):
        """`weights`: "int8" / "int4" / "q4_k" run the draft's layers (and a reduced head) quantized, None dense,
        "auto" as the target runs (quantized on a CPU whose target is)."""
        model, config = draft.model, draft.config
        weights = draft_weights(target, weights)
        self.target = target
        decoder = parts(model)
        self.layer_modules = quantized_copy(decoder.layer_modules, weights, dtype=target.dtype)
        self.layers = [decoder.Layer(module) for module in self.layer_modules]
        self.embed, self.norm, self.rotaries = decoder.embed, decoder.norm, decoder.rotaries
        self.embedding_scale, self.residual_scale = decoder.embedding_scale, decoder.residual_scale  # Granite's
        self.attention_cap = decoder.attention_cap  # Gemma 2's
        self.head = DraftHead(target, draft.draft_vocab, weights, lm_head=None if draft.student else decoder.head,
                              config=None if draft.student else config)  # fmt: skip
        self.vocab_size = config.vocab_size  # the draft's own: the target's may be longer
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.draft = draft
        self.ids: list[int] = []
        self.use_cache_policy(policy)

    def use_cache_policy(self, policy: str | CachePolicy) -> None:
        """Read the context as `policy` says (full, streaming, retrieval; or a policy of other sizes) from the
        next proposal on."""
        self.policy = make_policy(policy, self.target) if isinstance(policy, str) else policy
        capacity = self.target.cache.max_len + 1
        self.cache = WorkingCache(len(self.layers), self.kv_heads, self.head_dim, capacity,
                                  self.policy.working_slots(capacity), dtype=self.target.dtype,
                                  device=self.target.device, rotaries=self.rotaries,
                                  ropes=[layer.rope for layer in self.layers])  # fmt: skip
        self.fresh = True  # the next proposal lays the working cache out from scratch

    @torch.inference_mode()
    def prefill(self, ids: list[int], hidden: torch.Tensor, reused: int) -> None:
        """Run the draft over the prompt now, right after the target's prefill: its cost counts with the
        prompt's, not with the first step's."""
        same = self.new_request(ids, reused)
        self.cache.truncate(same)
        self.fresh = True
        self._catch_up()

    @torch.inference_mode()
    def propose(self, budget: int, sampling: SamplingConfig, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:  # fmt: skip
        root_logits = self._catch_up()
        root, working = self.cache.size - 1, self.cache.size  # the root's compact position: in the working cache
        tree, depths = TreeRows(len(self.layers), self.target.device), itertools.count(1)

        def expand(columns: list[int], parents: list[int]) -> torch.Tensor:  # the nodes of the next depth
            rows = tree.add(parents)
            ids = self.head.target_ids(torch.tensor(columns, device=self.target.device))
            compact = torch.full((len(rows),), root + next(depths), device=self.target.device)
            mask = torch.cat([torch.ones(len(rows), working, dtype=torch.bool, device=self.target.device),
                              tree.seen(rows)], dim=1)  # fmt: skip
            logits, new = self._forward(ids, compact, mask, tree)
            tree.write([rotated for _, _, rotated in new], [v for _, v, _ in new])
            return logits.float().softmax(dim=-1)

        columns = grow_tree(root_logits.float().softmax(dim=-1), expand, budget, self.kind,
                            children=None if noise is None else self._guesses(sampling, noise))  # fmt: skip
        return DraftTree(self.head.target_ids(torch.tensor(columns.tokens, dtype=torch.long)).tolist(),
                         columns.parents, columns.origins)  # fmt: skip

    def _guesses(self, sampling: SamplingConfig, noise: PositionNoise) -> Children:
        """A node's children where the target's draws are keyed: the winners of the race its draft distribution,
        processed as the target's is, runs under the noise the target's draw at their index will use."""
        first = len(self.ids)  # the text index of the root's children

        def guesses(probs: torch.Tensor, depth: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
            q = self.head.probs(probs.log(), sampling)  # log-probabilities are logits to the sampling pipeline
            return noise.guess(q, [first + depth - 1] * len(probs), k, self.head.target_ids)

        return guesses

    def _catch_up(self) -> torch.Tensor:
        """Run the draft over the committed tokens it has not seen (at least the newest: the engine reuses at
        most all but a prompt's last token) and cache their keys and values; returns the newest one's logits."""
        selection = self.policy.select(self.cache.length, force=self.fresh)
        if selection is not None:
            self.cache.select(selection)
        self.fresh = False
        start, slots = self.cache.length, self.cache.keys.shape[2]
        while True:
            end = min(start + BLOCK, len(self.ids))
            if self.cache.size + end - start > slots:  # a long prompt: lay out again before the next block
                self.cache.select(self.policy.select(start, force=True))
            count, size = end - start, self.cache.size
            ids = torch.tensor(self.ids[start:end], device=self.target.device)
            compact = torch.arange(size, size + count, device=self.target.device)
            mask = torch.ones(count, size + count, dtype=torch.bool, device=self.target.device)
            mask[:, size:].tril_()
            logits, new = self._forward(ids, compact, mask, last_only=True)
            self.cache.append(*(torch.stack([layer[i] for layer in new]) for i in range(3)))
            start = end
            if start == len(self.ids):
                return logits[-1]

    def _forward(self, ids, compact, mask, tree: TreeRows | None = None, *, last_only=False):
        """Draft logits [rows (the last only with `last_only`), draft vocab] of `ids` at `compact` positions,
        attending to the working cache, then to earlier rows of `tree`, then to themselves, as `mask`
        [rows, working + tree + rows] says; and per layer the rows' (keys before RoPE, values, rotated keys)
        [kv_heads, rows, D]."""
        x = self.embed(ids.clamp(max=self.vocab_size - 1))  # an id past the draft's vocabulary reads as its last
        x = x if self.embedding_scale == 1.0 else x * self.embedding_scale
        tables = [self.cache.tables(compact, x, rope) for rope in range(len(self.rotaries))]
        size, rows = self.cache.size, len(ids)
        new = []
        for i, layer in enumerate(self.layers):
            cos, sin = tables[layer.rope]
            h = layer.input_norm(x)
            q = self._split(layer.q(h), self.heads)
            k = self._split(layer.k(h), self.kv_heads)
            v = self._split(layer.v(h), self.kv_heads)
            if layer.q_norm is not None:  # qwen3's and Gemma's per-head norms, before RoPE
                q, k = layer.q_norm(q), layer.k_norm(k)
            q, rotated = rotate(q, cos, sin), rotate(k, cos, sin)
            if layer.scaling != self.head_dim**-0.5:  # `attend` scales scores by D^-1/2 (Gemma 3 27B's differ)
                q = q * (layer.scaling * self.head_dim**0.5)
            earlier_keys, earlier_values = (tree.keys[i], tree.values[i]) if tree is not None else ((), ())
            keys = torch.cat([self.cache.keys[i, :, :size], *earlier_keys, rotated], dim=1)
            values = torch.cat([self.cache.values[i, :, :size], *earlier_values, v], dim=1)
            seen = _in_window(mask, compact, size, layer.window)
            out = layer.o(attend(q, keys, values, seen, self.attention_cap).transpose(0, 1).reshape(rows, -1))
            x = x + self._residual(out, layer.attention_output_norm)
            x = x + self._residual(layer.mlp(layer.mlp_norm(x)), layer.mlp_output_norm)
            new.append((k, v, rotated))
        x = x[-1:] if last_only else x
        return self.head(self.norm(x)), new

    def _residual(self, out: torch.Tensor, norm) -> torch.Tensor:
        """A half's output as it joins the residual stream: normed (Gemma's), scaled (Granite's)."""
        out = out if norm is None else norm(out)
        return out if self.residual_scale == 1.0 else out * self.residual_scale

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.shape[0], heads, self.head_dim).transpose(0, 1)  # [heads, rows, D]

    def memory_bytes(self) -> int:
        """What the draft holds besides its weights: its stored keys and values and the working cache."""
        return self.cache.nbytes()

    def weight_bytes(self) -> int:
        own = [self.layer_modules] + ([] if self.head.draft_vocab is None else [self.head.lm_head])
        return sum(t.numel() * t.element_size() for m in own for t in (*m.parameters(), *m.buffers()))


def _in_window(mask: torch.Tensor, compact: torch.Tensor, size: int, window: int) -> torch.Tensor:
    """`mask` [rows, size + ...] with the working cache's slots (compact positions 0 .. size - 1) hidden from rows
    at `compact` positions that a sliding window of `window` keys has left behind (0: all seen)."""
    if not window:
        return mask
    behind = torch.arange(size, device=mask.device)[None, :] <= compact[:, None] - window
    return torch.cat([mask[:, :size] & ~behind, mask[:, size:]], dim=1)


def fetch_checkpoint(repo: str) -> str:
    """A profile's published draft model, by repo id: transformers finds it in the cache (or fetches it) in
    whichever weight format it was published; a `repo/file.gguf` is found as a profile's GGUF target is."""
    if repo.endswith(".gguf"):
        from specchat.loading import find_gguf

        return str(find_gguf(repo))
    return repo


def build(target: TargetView, checkpoint: Path | str, *, cache: str = "retrieval") -> ModelDrafter:
    """The registry's factory: the draft model at `checkpoint` (a directory, a Hugging Face id or a profile
    alias) over `target`, reading its own cache as the policy `cache` says."""
    return ModelDrafter(target, load_draft_model(_location(checkpoint), target.model, target.tokenizer), policy=cache)


def _location(checkpoint: Path | str) -> Path | str:
    """`model:ALIAS` drafts with that profile's target (a small model for a large one of its family); the
    embedded model with its weights dequantized, as transformers loads them."""
    from specchat.loading import embedded_checkpoint, profile_gguf
    from specchat.profiles import load_profiles

    profile = load_profiles().get(str(checkpoint))
    if profile is None:
        return checkpoint
    if profile.gguf:
        return profile_gguf(profile)
    return embedded_checkpoint(dense=True) if profile.embedded else profile.target
