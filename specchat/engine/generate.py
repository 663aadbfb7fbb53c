"""The decode loop: prefill, then draft -> verify -> commit, yielding a `StepEvent` per step.

The engine owns the session's static KV cache and the committed token ids. Prompts that extend what is
already committed (a chat's next turn) only prefill their new suffix.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
import time
from collections.abc import Iterator

import torch

from specchat.architectures import parts
from specchat.architectures.llama import LlamaParts
from specchat.checks import check_kv_cache
from specchat.disk_cache import cache_dir
from specchat.engine.attention import sliding_window
from specchat.engine.budget import CALIBRATED_SIZES, MAX_BUDGET, AdaptiveBudget
from specchat.engine.cache import TreeCache, check_cache_fits
from specchat.engine.constraint import ConstrainedText, Constraint
from specchat.engine.cuda_graphs import captures
from specchat.engine.drafter import Drafter, TargetView
from specchat.engine.events import FORCED, KNOWN, TARGET, StepEvent, TokenLogprob
from specchat.engine.host_data import to_device
from specchat.engine.keyed_draws import PositionNoise, choose
from specchat.engine.lean_forward import LeanForward
from specchat.engine.prefix_store import PrefixStore
from specchat.engine.sampling import Processed, SamplingConfig, process_rows, token_logprobs
from specchat.engine.stats import GenerationStats
from specchat.engine.step_clock import StepClock
from specchat.engine.target_forward import forward_path, held_kv_cache, target_forward
from specchat.engine.text import TextStream
from specchat.engine.tree import DraftTree, TreeBatch, node_histories, tree_batch
from specchat.engine.verify import verify
from specchat.engine.verify_cost import VerifyCost, cached_verify_cost, measure_verify_cost, priced_context
from specchat.engine.verify_forward import verification_forward
from specchat.errors import SpecchatError
from specchat.first_use import first_use
from specchat.kernels.cpu.cpu_decoder import source_version
from specchat.quant.formats import weight_format

KEPT_CONSTRAINTS = 8  # schemas and tool sets whose constraints (and masks) an engine keeps for later requests
JSON_MODE = json.dumps(["json", None])  # the key of JSON mode's constraint, kept always
PROMPT_CHUNK = 512  # prompt rows a forward scores at once in `prompt_logprobs` (their logits: rows x vocab floats)
# Prompt rows one forward of the CPU decoder prefills: past this, a forward's [rows, intermediate] activations outgrow
# the caches, and an 8K-token prompt prefills 1.27x faster in pieces of 512 (llama.cpp's batches are 512 too)
CPU_PREFILL_ROWS = 512


class Engine:
    """Generates with one target model over a cache of `max_len` slots, allocated once.

    With a drafter, each step verifies the drafter's tree in one target forward; without one (or with an
    empty tree) a step is plain autoregressive decoding. The tree budget is `draft_budget` when given, else
    chosen step by step by an `AdaptiveBudget` calibrated for this model on this machine. `set_drafter`
    changes drafter and budget between requests and keeps the cache: a chat's next answer reuses its KV.
    A drafter that reads the target is built from `engine.target`. `kv_cache="int8"` holds the target's keys and
    values in int8, `"bf16"` in bf16 (both the compiled CPU decoder only), `"auto"` as `held_kv_cache` says. With
    `prefix_bytes`, texts the cache held before are kept up to that many bytes, and a prompt that shares a prefix
    with one reuses it (`PrefixStore`).
    """

    def __init__(self, model, tokenizer, *, max_len: int | None = None, drafter: Drafter | None = None,
                 draft_budget: int | None = None, kv_cache: str = "auto", prefix_bytes: int = 0):  # fmt: skip
        self.model = model
        self.tokenizer = tokenizer
        check_kv_cache(kv_cache)
        self.tree_capacity = MAX_BUDGET  # slots kept for a verified tree, whatever the drafter: it may change
        self.context_window = model.config.max_position_embeddings
        self.max_len = min((max_len or self.context_window) + self.tree_capacity, self.context_window)
        self.device = model.device
        self.eos_ids = eos_ids(model, tokenizer)
        windows = [layer.window for layer in parts(model).layers]  # a sliding window's layers hold it alone
        kv_cache = held_kv_cache(model, kv_cache)
        self.cache = TreeCache(model.config.num_hidden_layers, self.max_len, kv_cache, windows)
        check_cache_fits(model, self.cache)
        with first_use("preparing the CPU decoder (compiled once per machine, a minute or more)"):
            self.forward = target_forward(model, self.cache)
        self.canonical = isinstance(self.forward, LeanForward)  # the compiled CPU decoder runs it
        if kv_cache != "auto" and not self.canonical:
            raise SpecchatError(
                f"--kv-cache {kv_cache} needs the compiled CPU decoder: a Llama-family model on a CPU, --attention "
                "auto or canonical"
            )
        if kv_cache == "bf16" and model.dtype == torch.float16:
            raise SpecchatError("--kv-cache bf16 holds keys beside fp32 or bf16 activations: use --kv-cache auto with "
                                "--dtype float16")
        if kv_cache == "int8" and sliding_window(model.config):
            raise SpecchatError("--kv-cache int8 does not run sliding-window layers (Gemma 3's): use --kv-cache auto")
        self.prefixes = PrefixStore(prefix_bytes) if prefix_bytes else None  # earlier texts' cached prefixes
        self.ids: list[int] = []  # committed ids, on the host; the cache holds all but the last (the root)
        self._queries: torch.Tensor | None = None  # the last forward's last-layer rotated queries [q, heads, D]
        self._last_query: torch.Tensor | None = None  # [heads, D] fp32 of the newest position in the cache
        self._verify_costs: dict[str, VerifyCost] = {}  # calibration key -> its prices, kept up to date
        self._constraints: dict[str, Constraint] = {}  # JSON mode, recent schemas and tools (`_kept`)
        # On a GPU the next step's drafting and verification forward are queued before the caller handles this
        # step's event: the device runs them while the host streams text and the caller consumes the event
        # (`_queue_step`). A CPU computes as it queues, so there it would only hold the event back.
        self.launch_ahead = self.device.type == "cuda"
        self._queued: StepLaunch | None = None  # the next step's, its rows pending in the cache
        self.target = TargetView.of(model, self.cache, forward=self._draft_forward,
                                    last_query=lambda: self._last_query, tokenizer=tokenizer,
                                    layer_queries=self._layer_queries)  # fmt: skip
        self.set_drafter(drafter, draft_budget)

    @property
    def length(self) -> int:
        """Committed ids, prompt included."""
        return len(self.ids)

    def set_drafter(self, drafter: Drafter | None, draft_budget: int | None = None) -> None:
        """Draft with `drafter` (None: autoregressive) from the next request on, at a fixed budget or adaptive."""
        if draft_budget is not None and not 1 <= draft_budget <= MAX_BUDGET:
            raise SpecchatError(f"the draft budget must be between 1 and {MAX_BUDGET}")
        self.drafter = drafter
        self.fixed_budget = draft_budget
        self.policy: AdaptiveBudget | None = None  # created on first use (calibration runs a few forwards)
        # the budgets and sampling settings (but the seed) the drafter has proposed at: its first proposal at each
        # pays what it does once (its kernels compiled, its graphs captured, its buffers allocated), a price the
        # budget is not told
        self._drafted_at: set[tuple[int, SamplingConfig]] = set()

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The target layers whose input states the drafter reads (none: the last layer's output)."""
        return (self.drafter.feature_layers or ()) if self.drafter is not None else ()

    @property
    def _no_rows(self) -> torch.Tensor:
        width = self.model.config.hidden_size * max(1, len(self.state_layers))
        return torch.empty(0, width, device=self.device, dtype=self.model.dtype)

    @property
    def capacity(self) -> int:
        """Tokens a session may hold: the cache less the slots a verified tree needs."""
        return self.max_len - self.tree_capacity

    def json_constraint(self, schema: dict | None = None) -> Constraint:
        """JSON mode for `generate(constraint=...)`: one JSON object, or with `schema` one that JSON Schema allows
        (`constraints.SchemaError` where the schema is outside the subset). Kept for later requests with their
        cached masks, the last few schemas' too."""
        from specchat.constraints import JsonSchema, SyntaxText, json_syntax

        def build():
            return SyntaxText(self._vocabulary, json_syntax if schema is None else JsonSchema(schema), self.eos_ids)

        return self._kept(("json", schema), build)

    def grammar_constraint(self, grammar: str, *, regex: bool = False) -> Constraint:
        """A text a GBNF grammar derives (llama.cpp's format), or with `regex` one the regular expression `grammar`
        matches whole (`constraints.GrammarError` where it cannot be read or held), then the end; what the grammar
        leaves no choice about is drafted. Kept as `json_constraint`'s."""
        from specchat.constraints import Grammar, SyntaxText

        def build():
            encode = functools.partial(self.tokenizer.encode, add_special_tokens=False)
            held = Grammar.from_regex(grammar) if regex else Grammar.from_gbnf(grammar)
            return SyntaxText(self._vocabulary, held, self.eos_ids, encode)

        return self._kept(("regex" if regex else "grammar", grammar), build)

    def tool_call_constraint(self, functions: list[dict], form, *, choice: str = "auto",
                             parallel: bool = True) -> Constraint:  # fmt: skip
        """An answer that may call `functions` (OpenAI's function objects) in `form` (`tool_calls.tool_format`),
        each call held to its function's parameters (leniently: what the subset cannot hold is left free; a strict
        function's schema must be inside it) and laid out as the template writes one, under OpenAI's `choice`
        ("auto", "required" or "none"; a form without tags, whose call is the whole answer, only "required")."""
        from specchat.constraints import JsonSchema, SyntaxText, ToolCallText
        from specchat.tool_calls import call_schema

        def build():
            schema = call_schema(functions, form.arguments)
            encode = functools.partial(self.tokenizer.encode, add_special_tokens=False)
            if not form.tagged:
                if choice != "required":
                    raise ValueError("a call that is the whole answer is held only where one is required")
                return SyntaxText(self._vocabulary, JsonSchema(schema, lenient=True, canonical=True), self.eos_ids,
                                encode)  # fmt: skip
            syntax = JsonSchema(schema, lenient=True, canonical=True, padded=True)
            return ToolCallText(self._vocabulary, syntax, form.open_id, form.close_id, self.eos_ids, encode,
                                choice=choice, parallel=parallel)  # fmt: skip

        key = ("tools", functions, form.arguments, form.open_id, form.close_id, choice, parallel)
        return self._kept(key, build)

    def _kept(self, key: tuple, build) -> Constraint:
        """The constraint `key` names, built once and kept with its cached masks (JSON mode always, the last
        KEPT_CONSTRAINTS others)."""
        name = json.dumps(key, sort_keys=True)
        if name not in self._constraints:
            self._constraints[name] = build()
            if len(self._constraints) > KEPT_CONSTRAINTS + 1:
                del self._constraints[next(k for k in self._constraints if k != JSON_MODE)]
        return self._constraints[name]

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes as a text holds them (a special token's name, which a text does not hold as bytes)."""
        pieces = self._vocabulary.pieces
        piece = pieces[token] if token < len(pieces) else None
        return piece if piece is not None else (self.tokenizer.convert_ids_to_tokens(token) or "").encode()

    @functools.cached_property
    def _vocabulary(self):
        """The model's ids by their bytes, for every constraint's masks: sorting 150K tokens takes ~0.5 s, once."""
        from specchat.constraints import Vocabulary, vocabulary_bytes

        return Vocabulary(vocabulary_bytes(self.tokenizer), self.model.config.vocab_size)

    @property
    def exact_reuse(self) -> bool:
        """Whether a prompt that reuses a cached prefix gets bitwise the logits of one prefilled whole: so on the
        CPU decoder, whose prefill rows are each a decode step at their position (row-independent matmuls, and
        each row's attention over its own keys in order); the torch decoder rounds a prefill by its rows."""
        return self.canonical

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingConfig = SamplingConfig(),
        max_new_tokens: int = 512,
        stop: tuple[str, ...] = (),
        index_offset: int = 0,
        known: list[int] = (),
        fresh: bool = False,
        constraint: Constraint | None = None,
        logprobs: int | None = None,
        min_tokens: int = 0,
    ) -> Iterator[StepEvent]:
        """Prefill `prompt_ids` and yield a `StepEvent` per step until EOS, a stop string, `max_new_tokens` or a
        full cache.

        A sampled choice is keyed by its token's index in the text (`PositionNoise`: seeded by `sampling.seed`, or a
        fresh seed; the prompt's first token is index `index_offset`, for a text whose beginning the cache no longer
        holds): the output is then distributed exactly as target-only sampling and, for one seed, the same whatever
        drafted it, whatever the trees' sizes, and after a restart. A drafter is handed the noise: one whose
        distribution is close to the target's guesses the draws by racing it under the same noise, which beats its
        likeliest tokens wherever the target samples a broad distribution.

        `known`: tokens the text is known to go on with (a book being resumed, `writer/write.py`). While the
        output follows them, each step verifies the next ones as a chain, whatever the drafter: re-deriving a
        text costs one forward per MAX_BUDGET tokens instead of one per token, and commits what the target
        itself picks (a verified row is bitwise a decode step), so the output stays exact.

        `fresh` prefills the whole prompt, as a new engine would, instead of reusing the cached prefix it shares
        with the last request: where reuse is not exact (`exact_reuse`), the output is then exactly a new
        engine's (a prompt prefilled in pieces, or after decode steps, is rounded differently there).

        `constraint` holds the output to a syntax (`json_constraint()`: JSON mode, or a JSON Schema;
        `grammar_constraint()`: a GBNF grammar): every row's logits are masked to the ids it allows next before
        the sampling pipeline, in AR decoding and in every verified row alike (`engine/constraint.py`); with a drafter,
        what the syntax forces is verified as a chain.

        `logprobs` (N >= 0): every event also carries each token's log-probability and the N most likely ids at
        its row (`StepEvent.logprobs`), read from the rows verification computed anyway.

        `min_tokens` (vLLM's): before this many new tokens the end of text is never chosen, at every verified row
        by its own position, and stop strings are not looked for.
        """
        if not prompt_ids:
            raise SpecchatError("the prompt is empty")
        if max_new_tokens < 1:
            raise SpecchatError("max_new_tokens must be at least 1")
        if len(prompt_ids) >= self.capacity:
            raise SpecchatError(f"the prompt has {len(prompt_ids)} tokens; the context holds {self.capacity}")
        room = self.capacity + 1 - len(prompt_ids)  # the last token needs no cache slot
        budget, limit = (max_new_tokens, "length") if max_new_tokens <= room else (room, "context")
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        noise = None
        if not sampling.greedy:
            noise = PositionNoise(secrets.randbits(62) if sampling.seed is None else sampling.seed, index_offset)
        stream = TextStream(self.tokenizer, stop, unmatched=min_tokens)
        constrained = ConstrainedText(constraint) if constraint is not None else None

        start = time.perf_counter()
        self._queued = None  # an earlier text's launched step is never verified
        if fresh:
            self.cache.truncate(0)
        continued = self.cache.length > 0 and self.ids[: self.cache.length] == prompt_ids[: self.cache.length]
        logits = self._prefill(prompt_ids, stats, reuse=not fresh)
        processed = self._process(logits, sampling, DraftTree.empty(), constrained, min_tokens)
        token = int(choose(processed, noise, [self.length])[0])
        scored = token_logprobs(processed.logits, [0], [token], logprobs) if logprobs is not None else None
        stats.prefill_seconds = time.perf_counter() - start
        if self.drafter is not None and self.fixed_budget is None and (self.policy is None or not continued):
            # acceptance belongs to a text: a new one (not a chat's next turn) starts with what it will show,
            # trees priced at its context
            self.policy = AdaptiveBudget(self._verify_cost())
        event = self._commit([token], [TARGET], self._no_rows, stats, stream, budget, limit, constrained)
        event = _with_logprobs(event, scored)
        ahead = _still_known(list(known), event.tokens)
        self._queue_step(event, stats, sampling, noise, ahead, constrained)
        yield event
        while event.finish_reason is None:
            start = time.perf_counter()
            launch, self._queued = self._queued, None
            if launch is not None and launch.overwritten:
                launch = self._verify_again(launch)
            launch = launch or self._launch(sampling, noise, ahead, constrained)
            tokens, origins, hidden, tree, tree_budget, draft_seconds, scored = self._step(
                launch, sampling, noise, constrained, logprobs, max(0, min_tokens - stats.new_tokens))
            stats.decode_seconds += time.perf_counter() - start
            event = self._commit(tokens, origins, hidden, stats, stream, budget, limit, constrained)
            event = _with_logprobs(event, scored)
            stats.decode_tokens += len(event.tokens)
            drafted = sum(origin != TARGET for origin in event.origins)  # what was output, not cut at a stop
            stats.record_step(tree.depth, drafted, tree_budget, draft_seconds, nodes=len(tree))
            ahead = _still_known(ahead, event.tokens)
            self._queue_step(event, stats, sampling, noise, ahead, constrained)
            yield event

    def _launch(self, sampling: SamplingConfig, noise: PositionNoise | None, known: list[int],
                constrained: ConstrainedText | None) -> StepLaunch:
        """A step's first half, queued without reading the device where the drafter needs no read: draft (or take
        the `known` tokens, or what the syntax forces, as a chain), then the target's forward of the root and the
        tree (pending)."""
        drafts = self.drafter is not None and constrained is not None and not known
        forced = constrained.forced() if drafts else []  # drafting asked for: what the syntax forces is its draft
        clock = StepClock(self.device)
        mode, priced = None, True
        if known or forced:
            tree = DraftTree.from_chains([(known or forced)[: self.tree_capacity]], KNOWN if known else FORCED,
                                         self.tree_capacity)  # fmt: skip
            budget, scored = len(tree), False
        else:
            mode = self.drafter.next_kinds() if self.policy else frozenset()
            scored = self.policy is not None and self.drafter.scores_nodes
            budget = self._draft_budget(mode, scored)
            least_chance = self.policy.least_chance() if scored else 0.0
            captured = captures()
            tree = (self.drafter.propose(budget, sampling, least_chance, noise) if budget
                    else DraftTree.empty())
            if budget:  # the drafter's first proposal at a setting, and one that captured a graph, paid a one-off
                setting = (budget, dataclasses.replace(sampling, seed=None))
                priced = setting in self._drafted_at and captures() == captured
                self._drafted_at.add(setting)
        clock.mark()
        proposed = None  # the scores of a tree cut on the device, which size the next once the acceptance read them
        if scored and self.policy.scored_size and (proposed := tree.queued_scores) is not None:
            tree = tree.first(self.policy.scored_size)  # the last tree's size: this one's scores are not read yet
        elif scored and len(tree):  # the nodes worth verifying, by the scores the drafter read
            tree = tree.cut(self.policy.size(tree.scores, clock.host_seconds() if priced else None))
        budget = len(tree) if scored else budget
        clock.mark()
        batch, logits, hidden = self._tree_forward(tree)
        return StepLaunch(tree, budget, mode, clock, batch, logits, hidden, priced, proposed)

    def _queue_step(self, event: StepEvent, stats: GenerationStats, *launch) -> None:
        """Where `launch_ahead` holds and the text goes on, launch the next step now (decoding time): the loop takes
        it instead of launching its own, unless a forward over the cache came between (`_forward` drops it)."""
        if self.launch_ahead and event.finish_reason is None:
            start = time.perf_counter()
            self._queued = self._launch(*launch)
            stats.decode_seconds += time.perf_counter() - start

    def _step(self, launch: StepLaunch, sampling: SamplingConfig, noise: PositionNoise | None,
              constrained: ConstrainedText | None, logprobs: int | None, held: int):
        """A step's second half: verify the launched tree (or just the root), commit the accepted KV.

        `held`: the next tokens that may not end the text (`min_tokens`).

        Returns the accepted tokens then the bonus, their origins, the hidden states of the rows kept in the
        cache (root and accepted nodes), the tree verified, its budget, the seconds the drafter took and, with
        `logprobs`, the tokens' log-probabilities (token i was chosen at kept row i).
        """
        tree, clock, batch, hidden = launch.tree, launch.clock, launch.batch, launch.hidden
        processed = self._process(launch.logits, sampling, tree, constrained, held)
        clock.mark()
        indices = batch.position_ids + 1 if noise else None  # a row chooses the token after it
        choices = choose(processed, noise, indices)
        verdict = verify(tree, choices)  # the step's wait for the device
        draft_seconds, _, verify_seconds = clock.seconds()  # drafting, sizing, verification
        priced_seconds = draft_seconds if launch.priced else None
        if launch.proposed is not None:  # read after the wait, before more is queued: no wait of its own
            self.policy.size(launch.proposed.tolist(), priced_seconds)
        kept = [0] + [node + 1 for node in verdict.path]
        leading = kept == list(range(len(kept)))  # a path down the first rows: a slice
        rows = slice(0, len(kept)) if leading else to_device(kept, self.device)
        self.cache.commit(kept if leading else rows)
        self._keep_query(kept[-1])
        if self.policy and launch.mode is not None:  # known and forced tokens say nothing about the drafter
            self.policy.observe(tree, verdict.path, budget=launch.budget, draft_seconds=priced_seconds,
                                verify_seconds=verify_seconds, mode=launch.mode)  # fmt: skip
        tokens = [tree.tokens[node] for node in verdict.path] + [verdict.bonus]
        origins = [tree.origins[node] for node in verdict.path] + [TARGET]
        hidden = hidden[rows] if self.drafter is not None else hidden  # only a drafter reads them
        token_scores = token_logprobs(processed.logits, kept, tokens, logprobs) if logprobs is not None else None
        return tokens, origins, hidden, tree, launch.budget, draft_seconds, token_scores

    def _overwrite_launch(self) -> None:
        """A forward over the cache overwrites a launched step's pending rows: the step verifies its tree again when
        it comes (`_verify_again`)."""
        if self._queued is not None:
            self._queued = dataclasses.replace(self._queued, overwritten=True)

    def _verify_again(self, launch: StepLaunch) -> StepLaunch:
        """A launched step whose rows a forward overwrote, its tree verified again: drafted once, since what came
        between (a measured decode step, rows left pending) committed nothing."""
        launch.clock.restart()
        batch, logits, hidden = self._tree_forward(launch.tree)
        return dataclasses.replace(launch, batch=batch, logits=logits, hidden=hidden, overwritten=False)

    def _tree_forward(self, tree: DraftTree):
        """The target's forward of the root and `tree` after the cache (pending): (its batch, logits, hidden)."""
        batch = tree_batch(tree, self.ids[-1], self.cache.length, self.device)
        mask = batch.tree_mask if len(tree) else None  # the root alone: a decode step
        logits, hidden = self._forward(batch.input_ids, positions=batch.position_ids, tree_mask=mask,
                                       feature_layers=self.state_layers)  # fmt: skip
        return batch, logits, hidden

    def _draft_budget(self, mode: frozenset[str], scored: bool) -> int:
        """The nodes to ask the drafter for: the adaptive budget's (for a scoring drafter a large tree, cut after),
        else the fixed budget, else none."""
        if self.policy is None:
            return self.fixed_budget if self.drafter else 0
        return self.policy.scored_budget() if scored else self.policy.next_budget(mode)

    def _verify_cost(self) -> VerifyCost:
        """Verification cost by tree size for this model, dtype, device, thread count and the class of the current
        context (`priced_context`), timed at the current context once per machine (cached on disk), then kept up
        to date by the forwards this engine times: one per calibration for the engine's lifetime."""

        def verify_forward(n: int):  # a chain of n nodes at the current context, never committed
            return verification_forward(self._forward, self.cache, self.device, tree=n)

        sizes = [n for n in CALIBRATED_SIZES if n <= self.tree_capacity]

        def measure() -> VerifyCost:
            with first_use("timing verification forwards of this model at this context (once per machine)"):
                return measure_verify_cost(verify_forward, sizes=sizes, device=self.device)

        key = (f"{calibration_key(self.model)}|sizes={','.join(map(str, sizes))}"
               f"|context={priced_context(self.cache.length)}")
        if key not in self._verify_costs:
            self._verify_costs[key] = cached_verify_cost(cache_dir() / "verify_cost.json", key, measure)
        return self._verify_costs[key]

    def _process(self, logits: torch.Tensor, sampling: SamplingConfig, tree: DraftTree,
                 constrained: ConstrainedText | None = None, held: int = 0) -> Processed:
        """Processed logits per verified row, each with its own history when the penalty needs one, masked first
        to what `constrained` allows in the row's own state, and without the end of text at the rows whose token
        is one of the next `held`."""
        if constrained is not None:
            logits = constrained.mask(logits, tree)
        if held:
            rows = [row for row, depth in enumerate((0, *tree.depths)) if depth < held]
            rows, eos = (to_device(ids, logits.device) for ids in (rows, sorted(self.eos_ids)))
            logits = logits.clone()
            logits[rows[:, None], eos] = float("-inf")
        history = None
        if sampling.uses_history:
            window = sampling.penalty_window
            committed = self.ids[max(0, self.length - window) :]
            history = to_device(node_histories(tree, committed, window), logits.device)
        return process_rows(logits, sampling, history)

    def _prefill(self, prompt_ids: list[int], stats: GenerationStats, *, reuse: bool) -> torch.Tensor:
        """Feed the prompt, reusing the cached KV of the longest prefix it shares with the session or, with
        `reuse`, with a text kept in `prefixes`."""
        prompt = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        shared = 0
        if self.cache.length:
            limit = min(self.cache.length, len(prompt_ids) - 1)
            shared = next((i for i in range(limit) if self.ids[i] != prompt_ids[i]), limit)
        if reuse and self.prefixes is not None:
            shared = self.prefixes.reuse(prompt_ids, self.ids[: self.cache.length], shared, self.cache)
        shared = self.cache.reach(shared)
        self.cache.truncate(shared)
        stats.reused_tokens = shared
        self.ids = list(prompt_ids)
        logits, hidden = self._feed(prompt[shared:], feature_layers=self.state_layers)
        self._keep_query(-1)
        if self.drafter is not None:
            self.drafter.prefill(prompt_ids, hidden, shared)
        return logits

    @torch.inference_mode()
    def hold_prefix(self, ids: list[int], layers: list[tuple[torch.Tensor, ...]], dtype: torch.dtype) -> None:
        """Take `layers` (`TreeCache.copy` of the text `ids`, activations in `dtype`, read back from a file) as the
        cache's text: a prompt that starts with `ids` then prefills only the rest. Exact only where reuse is."""
        self.cache.allocate(layers[0][0].shape[-3], layers[0][0].shape[-1], dtype, self.device)
        self.cache.restore(layers, len(ids))
        self.ids = list(ids)

    @torch.inference_mode()
    def prompt_logprobs(self, prompt_ids: list[int], top: int = 0) -> list[TokenLogprob | None]:
        """Each prompt token's log-probability under the model (its own distribution, at the row before the token)
        and the `top` most likely ids there; None for the first token, which no row predicts (what `echo` with
        log-probabilities answers, and what evaluation harnesses sum).

        The prompt is prefilled whole, as `generate(fresh=True)` would, in pieces of PROMPT_CHUNK rows whose logits
        are all kept, and stays in the cache: a `generate` of the same prompt next prefills only its last token
        (on the CPU decoder every row is the decode step at its position, so that is exact)."""
        if not prompt_ids:
            raise SpecchatError("the prompt is empty")
        if len(prompt_ids) >= self.capacity:
            raise SpecchatError(f"the prompt has {len(prompt_ids)} tokens; the context holds {self.capacity}")
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        self.cache.truncate(0)
        scored: list[TokenLogprob | None] = [None]
        chunk = min(PROMPT_CHUNK, self.cache.rows_per_forward)
        for start in range(0, len(prompt_ids), chunk):
            logits, _ = self._forward(ids[start : start + chunk])
            self.cache.commit()
            following = prompt_ids[start + 1 : start + 1 + logits.shape[0]]  # the token each row predicts
            scored += token_logprobs(logits, list(range(len(following))), following, top) if following else []
        self.ids = list(prompt_ids)
        return scored

    @torch.inference_mode()
    def target_states(self, ids: list[int], positions: torch.Tensor | None = None,
                      feature_layers: tuple[int, ...] = ()) -> torch.Tensor:  # fmt: skip
        """Run the target alone over `ids` from an empty cache, as a prefill would (training a drafter on the
        target's own features): the last layer's output before the final norm [len(ids), hidden_size], or the
        residual stream entering each of `feature_layers` side by side; every layer's keys and values stay in
        `self.cache` until the next request. `positions` default to 0, 1, ..."""
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        self.cache.truncate(0)
        _, hidden = self._feed(tokens, positions=positions, feature_layers=feature_layers)
        self.ids = list(ids)  # a later request may reuse this KV like any other prefix
        return hidden

    @torch.inference_mode()
    def embedding(self, ids: list[int]) -> torch.Tensor:
        """The text's embedding as Ollama and llama-server give one of a generative model: the final norm's output
        at each of its tokens, averaged (mean pooling) [hidden_size], fp32 and not scaled. The text's keys and
        values go to a cache of their own: the session's (a conversation's cached prefix) stays as it was."""
        if not ids:
            raise SpecchatError("the text to embed has no tokens")
        if len(ids) >= self.capacity:
            raise SpecchatError(f"the text has {len(ids)} tokens; the context holds {self.capacity}")
        scratch = TreeCache(self.model.config.num_hidden_layers, len(ids), self.cache.kv_cache)
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        hidden = self.forward(tokens, torch.arange(len(ids), device=self.device), None, scratch, last_only=True).hidden
        return LlamaParts(self.model).norm(hidden).float().mean(dim=0)

    def decode_states(self, ids: list[int]) -> torch.Tensor:
        """`target_states` computed one decode step at a time, as generated tokens and verified tree rows get
        them (a prefill may round otherwise: under the torch decoder, whose matmuls over many rows may sum otherwise):
        [len(ids), hidden_size]."""
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        self.cache.truncate(0)
        hidden = []
        for token in tokens:
            hidden.append(self._forward(token[None])[1])
            self.cache.commit()
        self.ids = list(ids)
        return torch.cat(hidden)

    def _draft_forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: TreeCache):
        """`TargetView.forward`: a causal forward over another cache (or this one, left pending)."""
        return self._forward(tokens, positions=positions, cache=cache)

    @torch.inference_mode()
    def _layer_queries(self, token: int, position: int) -> torch.Tensor:
        """`TargetView.layer_queries`: every layer's rotated query [layers, heads, D] (fp32) of `token` at
        `position` after this cache, whose pending row is then dropped."""
        tokens, positions = (torch.full((1,), value, device=self.device) for value in (token, position))
        self._overwrite_launch()
        out = self.forward(tokens, positions, None, self.cache, every_layer=True)
        self.cache.truncate(self.cache.length)
        return out.queries[:, 0].float()

    def _forward(self, tokens: torch.Tensor, *, positions=None, tree_mask=None, last_only=False, cache=None,
                 feature_layers: tuple[int, ...] = ()):  # fmt: skip
        """Run the target over `tokens` [q] written right after the cached prefix -> logits [q or 1, vocab] and
        the last decoder layer's output (before the final norm) [q, hidden_size], or the residual stream entering
        each of `feature_layers` side by side [q, len(feature_layers) * hidden_size]."""
        cache = cache if cache is not None else self.cache
        self._overwrite_launch()
        if positions is None:
            start = cache.length
            positions = torch.arange(start, start + tokens.shape[0], device=self.device)
        out = self.forward(tokens, positions, tree_mask, cache, last_only=last_only, feature_layers=feature_layers)
        self._queries = out.queries
        return out.logits, (out.features if feature_layers else out.hidden)

    def _feed(self, tokens: torch.Tensor, *, positions=None, feature_layers: tuple[int, ...] = ()):
        """`_forward` over `tokens` after the cached prefix, committed, in pieces (on the CPU decoder of
        CPU_PREFILL_ROWS, and of at most the rows a sliding window's layers hold past it) -> the last row's logits
        [1, vocab] and every row's output (or features) as `_forward` gives them. The CPU decoder computes each row
        bitwise as a decode step would, so the pieces change nothing but the time."""
        step, outputs = min(self.cache.rows_per_forward, CPU_PREFILL_ROWS if self.canonical else self.max_len), []
        for start in range(0, tokens.shape[0], step):
            piece = None if positions is None else positions[start : start + step]
            logits, rows = self._forward(tokens[start : start + step], positions=piece, last_only=True,
                                         feature_layers=feature_layers)  # fmt: skip
            self.cache.commit()
            outputs.append(rows)
        return logits, torch.cat(outputs)

    def _keep_query(self, row: int) -> None:
        """The last forward's row `row` is now the newest position in the cache: keep its query (fp32, a copy)."""
        self._last_query = self._queries[row].to(torch.float32, copy=True)

    def _commit(self, tokens, origins, hidden, stats, stream, budget, limit, constrained) -> StepEvent:
        """Append a step's tokens to the committed ids, cut exactly where autoregressive decoding would have
        stopped (EOS, a stop string, the token budget, whose end is `limit`), and build the step's event."""
        finish, text = None, ""
        for i, token in enumerate(tokens):
            text += stream.add([token])  # token by token: a stop string ends the output at its last token
            if token in self.eos_ids or stream.stopped or stats.new_tokens + i + 1 >= budget:
                finish = "eos" if token in self.eos_ids else "stop" if stream.stopped else limit
                tokens, origins = tokens[: i + 1], origins[: i + 1]
                break
        self.ids += tokens
        self.cache.truncate(self.length - 1)  # drop the KV of accepted tokens that were cut
        if self.drafter is not None:
            self.drafter.commit(tokens, hidden[: len(tokens)])
        if constrained is not None:
            constrained.commit(tokens)
        stats.new_tokens += len(tokens)
        if finish:
            text += stream.flush()
        return StepEvent(tokens, origins, text, finish, stats)

    @torch.inference_mode()
    def autoregressive_step_seconds(self, *, sampling: SamplingConfig = SamplingConfig(), repeats: int = 3) -> float:
        """Median seconds of one autoregressive decode step at the current context, committing nothing.

        The measured baseline of a speedup (docs/design.md, "Events, metrics and the UI"): same model, engine
        and machine, at the context as it is now. It runs what a step over an empty tree runs (forward of the
        root, sampling) and leaves the session as it was; call it between steps, never while another thread
        iterates `generate`.
        """
        if self.length == 0:
            raise SpecchatError("nothing is committed yet: there is no context to decode from")
        tree, noise, times = DraftTree.empty(), None if sampling.greedy else PositionNoise(0), []
        for _ in range(repeats):
            start = time.perf_counter()
            _, logits, _ = self._tree_forward(tree)
            verify(tree, choose(self._process(logits, sampling, tree), noise, [self.length]))  # ints out: synced
            times.append(time.perf_counter() - start)
        self.cache.truncate(self.cache.length)  # drop the pending root KV the forwards wrote
        return sorted(times)[len(times) // 2]


@dataclasses.dataclass(frozen=True)
class StepLaunch:
    """A step's drafting and verification forward, queued on the device, for `Engine._step` to verify."""

    tree: DraftTree
    budget: int
    mode: frozenset[str] | None  # the kinds that drafted the tree; None: known or forced tokens
    clock: StepClock
    batch: TreeBatch
    logits: torch.Tensor
    hidden: torch.Tensor
    priced: bool = True  # its drafting's time is priced (not the drafter's first at its budget and sampling)
    proposed: torch.Tensor | None = None  # a tree cut on the device: the scores of all it proposed
    overwritten: bool = False  # a forward over the cache came between: its rows must be computed again


def _with_logprobs(event: StepEvent, scored: list | None) -> StepEvent:
    """`event` with the log-probabilities of the tokens it kept (a step's are cut where its tokens are)."""
    return event if scored is None else dataclasses.replace(event, logprobs=scored[: len(event.tokens)])


def _still_known(known: list[int], tokens: list[int]) -> list[int]:
    """What remains of `known` after committing `tokens`; nothing once the output leaves it."""
    return known[len(tokens) :] if known[: len(tokens)] == tokens else []


def calibration_key(model) -> str:
    """What a verification forward's cost depends on: model and shapes, weights, activations, which forward runs
    it (on a CPU with how many threads), machine."""
    config = model.config
    shape = f"{config.num_hidden_layers}x{config.hidden_size}x{config.intermediate_size}x{config.vocab_size}"
    return (f"{model.name_or_path}|{shape}|{weight_format(model)}|{model.dtype}|{model.device}|"
            f"{forward_path(model)}|{source_version()}")  # fmt: skip


def eos_ids(model, tokenizer) -> frozenset[int]:
    """Every id that ends generation: the generation config's EOS ids plus the tokenizer's."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return frozenset(ids)
