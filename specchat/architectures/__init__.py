"""Where a decoder's parts are: one adapter per architecture, chosen by `config.model_type`.

Nothing else in specchat names a transformers module path (`model.model.layers[i].self_attn`, `rotary_emb`,
...): it asks `parts(model)` for the embedding, the layers and their projections and norms, the final norm, the
LM head and the rotary embedding. A new architecture is one file here and its entry in `ADAPTERS`.
"""

from __future__ import annotations

from torch import nn

from specchat.architectures.gemma2 import Gemma2Parts
from specchat.architectures.gemma3 import Gemma3Parts
from specchat.architectures.llama import LlamaParts
from specchat.architectures.phi3 import Phi3Parts
from specchat.architectures.smollm3 import SmolLM3Parts
from specchat.errors import SpecchatError

ADAPTERS = {model_type: adapter for adapter in (LlamaParts, Phi3Parts, SmolLM3Parts, Gemma3Parts, Gemma2Parts)
            for model_type in adapter.model_types}


def parts(model: nn.Module) -> LlamaParts:
    """The adapter of `model` (a transformers `*ForCausalLM`, or specchat's own `llama_model.CausalLM`), or a
    one-line error for an architecture specchat cannot reach into."""
    model_type = model.config.model_type
    adapter = ADAPTERS.get(model_type)
    if adapter is None:
        raise SpecchatError(f"the model is a {model_type}; specchat runs {', '.join(ADAPTERS)} models")
    return adapter(model)


def causal_lm(config, dtype, name_or_path: str = "") -> nn.Module:
    """specchat's own modules for `config`'s architecture (a GGUF file's weights go into them)."""
    from specchat.architectures import gemma3_model, llama_model

    gemma = Gemma3Parts.model_types + Gemma2Parts.model_types
    module = gemma3_model if config.model_type in gemma else llama_model
    return module.CausalLM(config, dtype, name_or_path)
