"""How a retrofitted model runs: the one attention function registered in transformers' AttentionInterface, the
attention modules the family table names, and the hooks that hand each mechanism its depth slot, the key-padding
mask and (CAT, conv-qkv) the inputs or outputs of the Q/K/V projections. `posprobe.retrofitting.install` installs
mechanisms with these pieces; the module docstring there says what retrofitting does to a model.

Its softmax stays apart from the observing kernel's (`posprobe.kernel`, the one that records, reads rows and edits):
this one trains. It runs under autograd with attention dropout, takes FlexAttention or SDPA with the bias as a mask
where those are faster, and computes the softmax in the model's dtype (the kernel's is float32, as transformers'
eager path), and the numbers of every fine-tuned model (RESULTS §3, §9, §18) rest on it. To observe a retrofitted
model, its mechanism's score bias would join the kernel as a tap.

Shapes: B batch, H heads, m sequence length, d_h head size; scores (B, H, m, m), row i = query, column j = key.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import posprobe.mechanisms.flex as flex
from posprobe.architectures.config import config_size, reserved_rows
from posprobe.architectures.table import Family, model_types
from posprobe.errors import PosprobeError
from posprobe.mechanisms.base import PositionalMechanism
from posprobe.mechanisms.catalogue import LayerShape

ATTENTION_NAME = "posprobe"
RETROFIT_MODEL_TYPES = model_types(retrofit=True)  # families retrofit can install into (the family table says)
# Score-bias mechanisms on CPU take the explicit softmax path (faster there than SDPA with a mask gradient);
# tests switch this off to exercise the SDPA-with-bias path that accelerators use.
EXPLICIT_ON_CPU = True


# -- the attention function ---------------------------------------------------------------------------
def _key_valid(mask: torch.Tensor | None) -> torch.Tensor | None:
    """`(B, n_k)` bool (True = real token) from a 2-D mask or a 4-D bidirectional padding mask."""
    if mask is None:
        return None
    if mask.dim() == 4:
        mask = mask[:, 0, 0, :]
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        return mask > torch.finfo(mask.dtype).min / 2
    return mask != 0


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


def active_mechanism(module: nn.Module) -> PositionalMechanism | None:
    """The mechanism of `module` for the depth it is running at now (None if not retrofitted)."""
    mechanisms = getattr(module, "posprobe_mechanisms", None)
    if mechanisms is None:
        return None
    if len(mechanisms) == 1:
        return mechanisms[0]
    return mechanisms[module._posprobe_slot]


def posprobe_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention with the module's mechanism; same contract as transformers' attention functions.

    query `(B, H, n_q, d_h)`, key/value `(B, H, n_k, d_h)`, attention_mask bool `(B, 1, n_q, n_k)` (True =
    attend), additive float, or None. Returns `(B, n_q, H, d_h)` and the probabilities (explicit path only).

    Path choice: on CUDA, score-bias mechanisms (tisa, fixed, dynamic, composite, ...) use FlexAttention
    with the mechanism's `score_mod` when torch has it and no attention dropout is active
    (`posprobe.mechanisms.flex`). Otherwise: mechanisms without a score bias or value term (cat, conv-qkv,
    depthwise) use torch's
    `scaled_dot_product_attention` exactly like the stock "sdpa" path. With a score bias, accelerators use
    SDPA with the bias as an additive mask; on CPU the explicit softmax(QK^T * scaling + bias) is faster
    (SDPA's CPU kernels are slow at producing a gradient for the mask). Mechanisms that need the
    probabilities (value terms) and `output_attentions` always take the explicit path.
    """
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    mech = active_mechanism(module)
    if flex.use_flex(query, mech, dropout, bool(kwargs.get("output_attentions"))):
        mod = mech.score_mod(query, key)
        out = None if mod is None else flex.flex_attention(query, key, value, mod, _key_valid(attention_mask), scaling)
        if out is not None:
            if mech.has_output_term:
                out = out + mech.output_term(value, _key_valid(attention_mask))
            return out.transpose(1, 2).contiguous(), None
    bias = mech.score_bias(query, key) if mech is not None else None
    explicit = (
        (mech is not None and mech.needs_probabilities)
        or bool(kwargs.get("output_attentions"))
        or (bias is not None and EXPLICIT_ON_CPU and query.device.type == "cpu")
    )
    weights = None
    if not explicit:
        attn_mask = attention_mask
        if bias is not None:
            shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            attn_mask = bias.expand(shape)  # a full-size mask gradient is much cheaper than a broadcast one
            if attention_mask is not None:
                attn_mask = attn_mask + _additive(attention_mask, bias.dtype)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout, scale=scaling)
    else:
        scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)
        if bias is not None:
            scores = scores.add_(bias)
        if attention_mask is not None:
            scores = scores.add_(_additive(attention_mask, scores.dtype))
        weights = torch.softmax(scores, dim=-1)
        probs = F.dropout(weights, p=dropout, training=module.training)
        out = torch.matmul(probs, value)
        if mech is not None and mech.needs_probabilities:
            out = out + mech.value_term(probs, value)
    if mech is not None and mech.has_output_term:
        out = out + mech.output_term(value, _key_valid(attention_mask))
    return out.transpose(1, 2).contiguous(), weights


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, posprobe_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


# -- locating the attention modules ---------------------------------------------------------------------
def model_type(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", "unknown"))


def _family(model: nn.Module) -> Family:
    """The family-table entry of a model retrofit can install into; one clear error otherwise."""
    from posprobe.mechanisms.catalogue import retrofit_family

    return retrofit_family(model_type(model))


def _module_at(model: nn.Module, path: str) -> nn.Module | None:
    """The submodule whose qualified name is `path` or ends in '.' + `path` (a task head's prefix does not
    matter; the shortest such name wins), or None."""
    names = [name for name, _ in model.named_modules() if name == path or name.endswith("." + path)]
    return model.get_submodule(min(names, key=len)) if names else None


def _modules_at(model: nn.Module, paths: list[str]) -> list[nn.Module | None]:
    """`_module_at` for many paths with one walk over the model's modules."""
    names = [name for name, _ in model.named_modules()]
    found = []
    for path in paths:
        matches = [name for name in names if name == path or name.endswith("." + path)]
        found.append(model.get_submodule(min(matches, key=len)) if matches else None)
    return found


def depth_slots(model: nn.Module) -> list[tuple[nn.Module, int]]:
    """`(attention module, slot)` for each attention call of one forward pass, in depth order. The module is
    the one holding the family table's `query` projection; with shared layers (ALBERT) the table's
    `layer_groups` say which group each depth runs, its inner layers called in turn."""
    family = _family(model)
    cfg = model.config
    if family.layer_groups is None:
        attention = family.query.rsplit(".", 1)[0]  # the module that owns the query projection
        paths = [attention.format(l=i) for i in range(cfg.num_hidden_layers)]
    else:
        template, groups_key, inner_key = family.layer_groups
        L, G, inner = cfg.num_hidden_layers, getattr(cfg, groups_key), getattr(cfg, inner_key)
        paths = [template.format(g=int(i / (L / G)), j=j) for i in range(L) for j in range(inner)]
    modules = _modules_at(model, paths)
    if any(m is None for m in modules):
        raise PosprobeError(f"model of type '{model_type(model)}' lacks its attention modules", "pass an encoder model")
    slots: list[tuple[nn.Module, int]] = []
    counts: dict[int, int] = {}
    for module in modules:
        slots.append((module, counts.get(id(module), 0)))
        counts[id(module)] = counts.get(id(module), 0) + 1
    return slots


def layer_groups_owner(model: nn.Module) -> nn.Module:
    """The module that runs every layer group of a shared-layer model (ALBERT's encoder): the owner of the list
    of groups the table's `layer_groups` template indexes with `{g}`."""
    template = _family(model).layer_groups[0]
    owner = _module_at(model, template.split(".{g}", 1)[0].rsplit(".", 1)[0])
    if owner is None:
        raise PosprobeError(f"model of type '{model_type(model)}' has no encoder module", "pass an encoder model")
    return owner


def embeddings_module(model: nn.Module) -> nn.Module:
    """The embeddings module (whose forward takes the position ids): the owner of the table's position table."""
    position = _family(model).position
    module = _module_at(model, position.rsplit(".", 2)[0]) if position and position.count(".") >= 2 else None
    if module is None:
        raise PosprobeError(
            f"model of type '{model_type(model)}' has no embeddings module holding its position table",
            "drop --drop-position-embeddings",
        )
    return module


def projection(model: nn.Module, module: nn.Module, role: str) -> nn.Module:
    """The `role` ('query', 'key' or 'value') projection of attention module `module`, named as the family table
    names it (the last part of `Family.query` / `key` / `value`)."""
    return module.get_submodule(getattr(_family(model), role).rsplit(".", 1)[1])


def layer_shape(model: nn.Module, module: nn.Module) -> LayerShape:
    """Heads (the config's), head size and input width (the query projection's) of attention module `module`."""
    query = projection(model, module, "query")
    heads = config_size(model.config.to_dict(), None, "heads")
    return LayerShape(num_heads=heads, head_dim=query.out_features // heads, input_size=query.in_features)


# -- hooks ------------------------------------------------------------------------------------------------
def _attention_pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
    n_slots = len(module.posprobe_mechanisms)
    if n_slots > 1:
        slot = module._posprobe_calls
        if slot >= n_slots:
            raise PosprobeError(
                "a shared (ALBERT) attention layer ran more often than the model has layers",
                "gradient checkpointing and calling layers outside the encoder are not supported "
                "for retrofitted ALBERT models",
            )
        module._posprobe_calls = slot + 1
        module._posprobe_slot = slot
    if module._posprobe_needs_padding:
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        module._posprobe_key_valid = _key_valid(mask)


def _make_encoder_pre_hook(shared: list[nn.Module]):
    def hook(encoder: nn.Module, args: tuple) -> None:
        for module in shared:
            module._posprobe_calls = 0

    return hook


def _make_input_hook(attention: nn.Module, role: str):
    def hook(linear: nn.Module, args: tuple):
        mech = active_mechanism(attention)
        return (mech.transform_inputs(role, args[0], attention._posprobe_key_valid),) + tuple(args[1:])

    return hook


def _make_projection_hook(attention: nn.Module, role: str):
    def hook(linear: nn.Module, args: tuple, out: torch.Tensor):
        mech = active_mechanism(attention)
        return mech.transform_projection(role, args[0], out, attention._posprobe_key_valid)

    return hook


def _position_embedding(model: nn.Module) -> nn.Embedding:
    position = _family(model).position
    table = _module_at(model, position.rsplit(".", 1)[0]) if position else None
    if not isinstance(table, nn.Embedding):
        raise PosprobeError(
            f"model of type '{model_type(model)}' has no learned position table to drop",
            "drop --drop-position-embeddings",
        )
    return table


def _first_real_row(model: nn.Module) -> int:
    """RoBERTa-family tables reserve `padding_idx + 1` leading rows (SPEC §1)."""
    return reserved_rows(model.config.to_dict(), str(getattr(model.config, "_name_or_path", "") or "the model"))


def _make_constant_position_hook(row: int):
    """Pre-hook for the embeddings module: every token (any sequence length) gets position id `row`."""

    def hook(embeddings: nn.Module, args: tuple, kwargs: dict):
        bound = inspect.signature(embeddings.forward).bind_partial(*args, **kwargs).arguments
        ref = bound.get("input_ids")
        ref = ref if ref is not None else bound.get("inputs_embeds")
        bound["position_ids"] = torch.full((1, ref.shape[1]), row, dtype=torch.long, device=ref.device)
        return (), dict(bound)

    return hook


def _average_position_table(model: nn.Module) -> None:
    table = _position_embedding(model)
    with torch.no_grad():
        mean = table.weight[_first_real_row(model) :].mean(dim=0)
        table.weight.copy_(mean.expand_as(table.weight))
