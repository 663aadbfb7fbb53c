"""TokenSwift's multi-token heads: gamma small residual blocks that turn the target's last hidden state at
position t into guesses for tokens t + 2, t + 3, ... through the target's own LM head.

The heads (bigai-nlco/TokenSwift, `MedusaModel` in `models/modeling_llama3_1.py`) are chained from the last
decoder layer's output, before the final norm:

    h = h + linear_i(input_layernorm_i(h))         # no bias; h carries on to head i + 1
    out_i = post_layernorm_i(h)                     # into the target's LM head

The LM head at t predicts t + 1, so head i (from 0) predicts token t + 2 + i. The LM head is not part of
this module: the drafter borrows the target's.

specchat's heads may also see the root, token t + 1 (`root_input`): when the heads draft, the target has
already chosen it, yet TokenSwift's heads guess t + 2 without it. EAGLE's drafter reads the state and the
token after it together; here a SiLU block over both (the state and the target's embedding of the token, each
normed: `TokenInput`) is added to the state before the chain, so everything after it is TokenSwift's. With
`chain_input` every later head reads the token the head before it guessed the same way (Hydra's sequentially
dependent heads): head i + 1 guesses t + 3 + i knowing t + 2 + i, so a tree's children depend on their parent's
token and the drafter runs the heads a depth at a time (`start`, `step`).

Checkpoints come in two forms. TokenSwift publishes its heads inside full-model checkpoints
(`TokenSwift/TokenSwift-Llama-3.1-8B`, `-Qwen2.5-*`, ...) as `model.medusa_layers.{i}.{linear,
input_layernorm,post_layernorm}.weight`, next to gigabytes of target weights: `read_published_heads` reads
only those tensors. specchat's own checkpoints (`save_heads`) are `heads.safetensors` (the same names
without `model.`) and a `config.json` with `model_type: "tokenswift"`; `load_heads` reads either. Heads
trained over a draft vocabulary (the most frequent answer tokens) keep it as `draft_vocab` and draft inside
it: the LM head's other rows were never trained against, so their logits mean nothing to the heads.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from specchat.drafters.checkpoint import HEADS, PICKLES, load_into
from specchat.drafters.draft_layers import RMSNorm
from specchat.drafters.packed_weights import unpack
from specchat.errors import SpecchatError

GAMMA = 3  # TokenSwift's heads: tokens t + 2 .. t + 4 from the state at t
PUBLISHED_PREFIX = "model."  # published heads sit in the target's own checkpoint, under its `model.`
PUBLISHED_INDEX = "model.safetensors.index.json"
PUBLISHED_SINGLE = "model.safetensors"
PARTS = ("linear", "input_layernorm", "post_layernorm")


@dataclass(frozen=True)
class TokenSwiftConfig:
    hidden_size: int
    rms_norm_eps: float
    gamma: int = GAMMA
    root_input: bool = False  # the heads also read the root token's embedding (`TokenInput`)
    chain_input: bool = False  # heads after the first also read the token the head before them guessed

    def __post_init__(self):
        if self.chain_input and not self.root_input:
            raise SpecchatError("TokenSwift heads that read their chain's tokens read the root token too")

    @classmethod
    def for_target(cls, config, gamma: int = GAMMA, root_input: bool = False,
                   chain_input: bool = False) -> TokenSwiftConfig:
        """The heads for a target's transformers config (its hidden size and RMS norm epsilon)."""
        return cls(config.hidden_size, getattr(config, "rms_norm_eps", 1e-6), gamma, root_input, chain_input)

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class Head(nn.Module):
    """One residual block; parameter names are the published checkpoints' keys."""

    def __init__(self, config: TokenSwiftConfig):
        super().__init__()
        self.linear = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TokenInput(nn.Module):
    """A token mixed into the heads' state: state + down(silu(up([norm(state); norm(token)]))).

    `down` starts at zero, so a fresh block changes nothing: fresh heads start as TokenSwift's do, and a
    trained checkpoint given new blocks starts as it was (the token is ignored until training finds a use
    for it)."""

    def __init__(self, config: TokenSwiftConfig):
        super().__init__()
        size = config.hidden_size
        self.state_norm = RMSNorm(size, config.rms_norm_eps)
        self.token_norm = RMSNorm(size, config.rms_norm_eps)
        self.up = nn.Linear(2 * size, size, bias=False)
        self.down = nn.Linear(size, size, bias=False)
        with torch.no_grad():
            self.down.weight.zero_()

    def forward(self, hidden: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        mixed = torch.cat([self.state_norm(hidden), self.token_norm(root.to(hidden.dtype))], dim=-1)
        return hidden + self.down(F.silu(self.up(mixed)))


class TokenSwiftHeads(nn.Module):
    """gamma chained heads over the target's last-layer states.

    A fresh module starts where Medusa's heads start: every `linear` is zero and every `post_layernorm` is
    the target's final norm (`final_norm`, when given), so each head's output is exactly the target's own
    final hidden state and its distribution the target's next-token distribution: a calibrated guess of the
    right scale in the LM head's input space rather than a random direction. The reference draws `linear`
    from N(0, 0.02) and starts the norms at one; for the default model that start's held-out loss is 13.2
    nats and head 1's top-3 accuracy 0.11, against 11.8 and 0.20 from this one. The chain's residual stream
    starts unchanged, so every head starts from the target's state, and the zero `linear` still gets a
    gradient at once (the outer product of the output's gradient and its normed input).
    """

    def __init__(self, config: TokenSwiftConfig, final_norm: torch.Tensor | None = None,
                 draft_vocab: torch.Tensor | None = None):  # fmt: skip
        """`draft_vocab`: the sorted target ids the heads were trained to rank (None: the whole vocabulary)."""
        super().__init__()
        self.config = config
        self.draft_vocab = draft_vocab
        self.medusa_layers = nn.ModuleList(Head(config) for _ in range(config.gamma))
        self.root_input = TokenInput(config) if config.root_input else None
        self.chain_inputs = (nn.ModuleList(TokenInput(config) for _ in range(config.gamma - 1)) if config.chain_input
                             else None)
        with torch.no_grad():
            for head in self.medusa_layers:
                head.linear.weight.zero_()
                if final_norm is not None:
                    head.post_layernorm.weight.copy_(final_norm)

    def forward(self, hidden: torch.Tensor, root: torch.Tensor | None = None, depth: int | None = None,
                chain: torch.Tensor | None = None) -> torch.Tensor:
        """The heads' normed outputs [depth, n, hidden_size] of the target's last-layer states `hidden`
        [n, hidden_size] (before its final norm); output i at row t feeds the LM head's guess of token t + 2 + i.
        `root` [n, hidden_size]: the target's embeddings of tokens t + 1, which heads with `root_input` read;
        `chain` [gamma - 1, n, hidden_size]: of tokens t + 2 + i, which head i + 1 reads with `chain_input`.
        `depth`: only the first heads (a small tree reaches no deeper; default all gamma)."""
        state, outputs = self.start(hidden, root), []
        for i in range(len(self.medusa_layers[:depth])):
            state, out = self.step(i, state, chain[i - 1] if i and chain is not None else None)
            outputs.append(out)
        return torch.stack(outputs) if outputs else hidden.new_empty(0, *hidden.shape)

    def start(self, hidden: torch.Tensor, root: torch.Tensor | None = None) -> torch.Tensor:
        """The state head 0 starts from: `hidden` [n, hidden_size], with the root's embedding `root` mixed in."""
        if self.root_input is None:
            return hidden
        if root is None:
            raise ValueError("these TokenSwift heads read the root token's embedding")
        return self.root_input(hidden, root)

    def step(self, i: int, state: torch.Tensor, token: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Head i over `state` [n, hidden_size] -> the state head i + 1 starts from and head i's normed output.
        `token` [n, hidden_size]: with `chain_input`, the embedding of the token head i - 1 guessed (i >= 1)."""
        if i and self.chain_inputs is not None:
            if token is None:
                raise ValueError("these TokenSwift heads read the token the head before guessed")
            state = self.chain_inputs[i - 1](state, token)
        head = self.medusa_layers[i]
        state = state + head.linear(head.input_layernorm(state))
        return state, head.post_layernorm(state)


def save_heads(directory: Path, heads: TokenSwiftHeads, dtype: torch.dtype = torch.bfloat16) -> None:
    """`heads.safetensors` (in `dtype`: a trained head ships in bf16, the precision it runs in) and
    `config.json`, which `load_heads` reads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().to(dtype).contiguous().cpu() for name, tensor in heads.state_dict().items()}
    if heads.draft_vocab is not None:
        tensors["draft_vocab"] = heads.draft_vocab.long().cpu()
    (directory / "config.json").write_text(json.dumps({"model_type": "tokenswift", **heads.config.to_dict()}, indent=1))
    save_file(tensors, directory / HEADS)


def load_heads(directory: Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
               target_config=None) -> TokenSwiftHeads:  # fmt: skip
    """The heads of `directory`: a specchat checkpoint (`save_heads`) or a published TokenSwift model, on
    `device` in `dtype` (None: as read). With `target_config`, the heads must fit that target's hidden size."""
    directory = Path(directory).expanduser()
    heads = _read_own(directory) if (directory / HEADS).is_file() else read_published_heads(directory)
    if target_config is not None and heads.config.hidden_size != target_config.hidden_size:
        raise SpecchatError(
            f"{directory}: the TokenSwift heads have hidden size {heads.config.hidden_size}; "
            f"the target has {target_config.hidden_size}"
        )
    return heads.to(device=device, dtype=dtype)


def read_published_heads(directory: Path) -> TokenSwiftHeads:
    """The heads inside a published TokenSwift model directory, reading only their tensors.

    The shard index (`model.safetensors.index.json`) says which shards hold `model.medusa_layers.*`; a
    single-file model's header lists its tensors. Each tensor is read alone (`safe_open` maps the file and
    copies only what is asked for), so the target's weights beside the heads are never loaded. The norms'
    epsilon is the model's `rms_norm_eps` (config.json).
    """
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise SpecchatError(f"{directory}: no such checkpoint directory")
    shards = _published_shards(directory)
    tensors = {}
    for shard, names in shards.items():
        try:
            with safe_open(directory / shard, "pt") as handle:
                for name in names:
                    tensors[name.removeprefix(PUBLISHED_PREFIX)] = handle.get_tensor(name)
        except (OSError, SafetensorError) as error:
            raise SpecchatError(f"{directory / shard}: unreadable safetensors file ({error})") from None
    if not (directory / "config.json").is_file():
        raise SpecchatError(f"{directory}: no config.json (the heads' norms take its rms_norm_eps)")
    config = _json(directory / "config.json")
    gamma = len({name.split(".")[1] for name in tensors})
    hidden = tensors.get("medusa_layers.0.linear.weight")
    if hidden is None:
        raise SpecchatError(f"{directory}: the TokenSwift heads lack {PUBLISHED_PREFIX}medusa_layers.0.linear.weight")
    heads = TokenSwiftHeads(TokenSwiftConfig(hidden.shape[1], config.get("rms_norm_eps", 1e-6), gamma))
    load_into(heads, tensors, directory)
    return heads


def download_heads(repo: str, download: Callable[[str, str], str] | None = None) -> Path:
    """The local directory of Hugging Face repo `repo`'s TokenSwift heads, fetching only what holds them: our
    own checkpoint's files, or a published model's config, shard index and the shards with
    `model.medusa_layers.*` (an 8B model's other shards are 16 GB of the target, which is loaded from its
    own repo). `download(repo, filename) -> local path` is `huggingface_hub.hf_hub_download` by default, its
    progress shown."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    from specchat.hub_download import DownloadBar

    download = download or partial(hf_hub_download, tqdm_class=DownloadBar)
    offline = f"the TokenSwift heads of {repo} are not cached and this machine is offline"
    uncached = False
    for name in (HEADS, PUBLISHED_INDEX, PUBLISHED_SINGLE):
        try:
            path = Path(download(repo, name))
        except LocalEntryNotFoundError:  # not cached, offline: it may still be another layout's file
            uncached = True
            continue
        except EntryNotFoundError:  # the repo has no such file
            continue
        try:
            for shard in _medusa_shards(_weight_map(path)) if name == PUBLISHED_INDEX else ():
                download(repo, shard)
            download(repo, "config.json")
        except LocalEntryNotFoundError:
            raise SpecchatError(offline) from None
        return path.parent
    if uncached:
        raise SpecchatError(offline)
    raise SpecchatError(f"{repo} holds neither TokenSwift heads ({HEADS}) nor a model with them")


def _weight_map(index: Path) -> dict[str, str]:
    weight_map = _json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise SpecchatError(f"{index}: no weight_map")
    return weight_map


def _medusa_shards(weight_map: dict[str, str]) -> dict[str, list[str]]:
    """Shard file -> the `model.medusa_layers.*` tensors it holds."""
    shards = defaultdict(list)
    for name, shard in weight_map.items():
        if name.startswith(f"{PUBLISHED_PREFIX}medusa_layers."):
            shards[shard].append(name)
    return dict(shards)


def _published_shards(directory: Path) -> dict[str, list[str]]:
    """The shard files that hold `model.medusa_layers.*` tensors, and those tensors' names in each."""
    prefix = f"{PUBLISHED_PREFIX}medusa_layers."
    index = directory / PUBLISHED_INDEX
    if index.is_file():
        shards = _medusa_shards(_weight_map(index))
        for shard in shards:
            if not (directory / shard).is_file():
                raise SpecchatError(f"{directory}: the shard {shard}, which holds TokenSwift heads, is missing")
    elif (directory / PUBLISHED_SINGLE).is_file():
        try:
            with safe_open(directory / PUBLISHED_SINGLE, "pt") as handle:
                names = [name for name in handle.keys() if name.startswith(prefix)]
        except (OSError, SafetensorError) as error:
            raise SpecchatError(f"{directory / PUBLISHED_SINGLE}: unreadable safetensors file ({error})") from None
        shards = {PUBLISHED_SINGLE: names} if names else {}
    elif any(child.suffix in PICKLES for child in directory.iterdir()):
        raise SpecchatError(f"{directory}: specchat reads only safetensors checkpoints and never unpickles "
                            ".bin/.pth files")
    else:
        raise SpecchatError(f"{directory}: neither TokenSwift heads ({HEADS}) nor a model ({PUBLISHED_SINGLE} or "
                            f"{PUBLISHED_INDEX})")  # fmt: skip
    if not shards:
        raise SpecchatError(f"{directory}: the model holds no TokenSwift heads ({prefix}*)")
    return dict(shards)


def _read_own(directory: Path) -> TokenSwiftHeads:
    if not (directory / "config.json").is_file():
        raise SpecchatError(f"{directory}: the TokenSwift checkpoint has no config.json")
    config = _json(directory / "config.json")
    if config.get("model_type") != "tokenswift":
        raise SpecchatError(f"{directory}: config.json says model_type {config.get('model_type')!r}, not 'tokenswift'")
    path = directory / HEADS
    try:
        with safe_open(path, "pt") as handle:
            tensors = unpack({name: handle.get_tensor(name) for name in handle.keys()})
    except (OSError, SafetensorError, ValueError) as error:
        raise SpecchatError(f"{path}: unreadable safetensors file ({error})") from None
    try:
        shape = TokenSwiftConfig(config["hidden_size"], config["rms_norm_eps"], config["gamma"],
                                 config.get("root_input", False), config.get("chain_input", False))
    except KeyError as missing:
        raise SpecchatError(f"{directory}: config.json lacks {missing}") from None
    draft_vocab = tensors.pop("draft_vocab", None)
    with torch.device("meta"):  # every weight comes from the file
        heads = TokenSwiftHeads(shape, draft_vocab=draft_vocab)
    load_into(heads, tensors, directory)
    return heads


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SpecchatError(f"{path}: unreadable JSON ({error})") from None
    if not isinstance(data, dict):
        raise SpecchatError(f"{path}: not a JSON object")
    return data
