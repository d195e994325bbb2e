"""Import GPT-2 weights in the Hugging Face layout into a headlab GPT of any layout."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from model.config import GPTConfig
from model.gpt import GPT

# transformers' GPT-2 uses Conv1D, which stores weights as (in, out): transpose to nn.Linear's (out, in).
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Causal-mask buffers that older transformers versions keep in the state dict.
_MASK_BUFFER = re.compile(r"\.attn\.(masked_)?bias$")


def import_hf_gpt2(
    hf_state_dict: Mapping[str, torch.Tensor],
    n_head: int,
    attention: str = "fused_qkv",
    kernel: str = "sdpa",
) -> GPT:
    """A headlab GPT holding the weights of a ``transformers`` ``GPT2LMHeadModel`` state dict.

    The shape (vocabulary, context, width, depth) is read from the weights; the
    number of heads is not visible in them, so it is passed (``hf_config.n_head``).
    """
    sd = {k.removeprefix("module."): v for k, v in hf_state_dict.items()}
    if "transformer.wte.weight" not in sd or "transformer.wpe.weight" not in sd:
        raise ValueError(
            "not a GPT2LMHeadModel state dict: no 'transformer.wte.weight' / "
            "'transformer.wpe.weight'; pass model.state_dict() of transformers' GPT2LMHeadModel"
        )
    vocab_size, n_embd = sd["transformer.wte.weight"].shape
    block_size = sd["transformer.wpe.weight"].shape[0]
    layers = [int(m[1]) for k in sd if (m := re.match(r"transformer\.h\.(\d+)\.", k))]
    if not layers:
        raise ValueError("not a whole GPT2LMHeadModel state dict: embeddings but no layers ('transformer.h.0. ...'); "
                         "pass model.state_dict() of transformers' GPT2LMHeadModel")  # fmt: skip
    n_layer = 1 + max(layers)
    config = GPTConfig(
        vocab_size=vocab_size,
        block_size=block_size,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        dropout=0.0,
        bias=True,
        attention=attention,
        kernel=kernel,
    )

    converted: dict[str, torch.Tensor] = {}
    for key, tensor in sd.items():
        if _MASK_BUFFER.search(key):
            continue
        if key.endswith(CONV1D):
            tensor = tensor.t()
        converted[key] = tensor.detach().clone()
    # Pad the token embedding up to the model's padded vocabulary; the LM head is tied to it.
    wte = converted["transformer.wte.weight"]
    padding = wte.new_zeros(config.padded_vocab_size - vocab_size, n_embd)
    converted["transformer.wte.weight"] = torch.cat([wte, padding])
    converted["lm_head.weight"] = converted["transformer.wte.weight"]

    model = GPT(config)
    model.load_weights(converted)  # GPT-2's c_attn is the fused layout; converted to `attention`
    return model
