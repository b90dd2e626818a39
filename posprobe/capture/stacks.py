"""Stacks run one after another (`Family.stacks`, BLT): record the self-attention of the stacks over the text's
positions, on the model's own eager path.

BLT runs a text's bytes through a byte encoder, a global transformer over patches of them and a byte decoder, with
cross-attention between bytes and patches; its entropy model (`patch_in_forward`) runs its own layers over the bytes
to choose the patches. Its forward pass returns the attentions of its entropy model's layers and its byte decoder's
only, and makes softmax calls of other shapes (patches, cross-attention), so neither its returned attentions nor the
softmaxes of the forward pass are one per layer. `StackRecorder` hooks the self-attention module of every recorded
layer (`table.stack_depths`: a byte stack's layer; the global layers are a hybrid's other layers,
`model.attention_layers`) and keeps, per layer, the probabilities A that module returns and the input S of the one
(B, H, m, m) softmax made inside it; the first-batch checks are the eager route's (`EagerRecorder.verify`). The model
runs as its config says: patches from its entropy model or one per byte, cross-attention included; nothing of it is
recorded but the byte layers.

Dimensions: B batch, H heads, m sequence length.
"""

from __future__ import annotations

from typing import Any

from posprobe.capture.eager import (
    MASKED_EXACTLY,
    EagerRecorder,
    _share_equal,
    masked_below,
    module_attentions,
)
from posprobe.errors import PosprobeError


def stacked_family(model):
    """The family of `model` when its stacks run one after another (`Family.stacks`), else None."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(model.config, "model_type", "")))
    return family if family is not None and family.stacks else None


def stack_attention_modules(net, depths: list[int]) -> list:
    """The self-attention module of each of `depths` (posprobe's layer numbers, `table.stack_depths`) of a model
    whose stacks run one after another: the family's query projection name less its last part ('{m}.layers.{l}.
    self_attn'), under the base model. PosprobeError for a depth of a stack over other positions (no such module is
    recorded) or for stacks over the text's positions with other head counts (the capture keeps one per layer)."""
    from posprobe.architectures import table as T

    family = stacked_family(net)
    config = {**net.config.to_dict(), "model_type": net.config.model_type}
    at = T.stack_depths(family, config)
    heads = {T.config_get(config, f"{section}.num_attention_heads") for _, section, read in family.stacks if read}
    if depths and len(heads) > 1:
        raise PosprobeError(
            f"'{net.config.model_type}' has stacks over the text's positions with other head counts ({sorted(heads)}),"
            " and the capture records one head count for every layer",
            "its content-free scores (`posprobe fhat`, `profiles`) read byte stacks that share their sizes",
        )
    template = family.query.rsplit(".", 1)[0]
    base = getattr(net, "base_model", net)
    modules = []
    for depth in depths:
        module, read, stored = at[depth]
        if not read:
            raise ValueError(f"layer {depth} runs over positions other than the text's ({module})")
        modules.append(base.get_submodule(template.format(m=module, l=stored)))
    return modules


class StackRecorder(EagerRecorder):
    """The eager route for a model whose stacks run one after another: runs batches through its eager attention and
    returns what its self-attention layers `depths` (posprobe's numbers) did, each from its own module."""

    def __init__(self, net, depths: list[int], n_heads: int):
        super().__init__(len(depths), n_heads)
        self.depths, self.modules = depths, stack_attention_modules(net, depths)
        self.use_cache: Any = None

    def start(self, model) -> None:
        super().start(model)
        self.use_cache = getattr(model.config, "use_cache", None)
        model.config.use_cache = False  # BLT's cache reads a layer count its top config does not have

    def stop(self, model) -> None:
        model.config.use_cache = self.use_cache
        super().stop(model)

    def forward(self, model, tokens, **kwargs) -> tuple[Any, list, tuple, list]:
        """(output, scores, probs, allowed) of one `TokenBatch`, as `EagerRecorder.forward`: per recorded layer S
        and A (B, H, m, m) from its own module. PosprobeError where a module did not make exactly one (queries x
        keys) softmax or returned no attention of that shape."""
        batch, m = tokens.input_ids.shape

        def run():
            return model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, **kwargs)

        output, scores, probs = module_attentions(model, self.modules, self.depths, self.n_heads, batch, m, run)
        allowed = _share_equal([(s[:, 0] > masked_below(s)) & (s[:, 0] != MASKED_EXACTLY) for s in scores])
        return output, scores, probs, allowed

    def verify(self, model, tokens, output, scores, probs, allowed) -> None:
        """The eager route's first-batch checks, after one of its own: the model's outputs on real tokens are finite
        (transformers' float64 BLT masks its cross-attention in float64 and softmaxes it in float32: the patch after
        the last byte attends no byte, a row of -inf, NaN, which the global layers' values carry to every byte)."""
        import torch

        from posprobe.kernel.routes import final_output

        if not bool(torch.isfinite(final_output(output)[tokens.real]).all()):
            dtype = final_output(output).dtype
            why = (
                " (a patch that attends no byte: its cross-attention row softmaxes to NaN)"
                if dtype == torch.float64
                else ""
            )
            raise PosprobeError(
                f"'{getattr(model.config, 'model_type', 'unknown')}' gives non-finite outputs on real tokens with its "
                f"eager attention in {str(dtype).replace('torch.', '')}{why}",
                "load the model in float32 or bfloat16",
            )
        super().verify(model, tokens, output, scores, probs, allowed)


def eager_route_recorder(net, depths: list[int], n_heads: int) -> EagerRecorder:
    """The recorder of the eager route for `net`: a `StackRecorder` where its stacks run one after another (BLT), a
    `PooledRecorder` where it pools the sequence between blocks (Funnel), a `NeighbourChunkRecorder` where its
    layers attend neighbour chunks (Reformer: `capture.chunks`), else the `EagerRecorder` of every layer."""
    from posprobe.capture.chunks import chunk_recorder
    from posprobe.capture.pooled import PooledRecorder, pooled_family

    chunks = chunk_recorder(net, depths, n_heads)
    if chunks is not None:
        return chunks
    if pooled_family(net) is not None:
        return PooledRecorder(net, depths, n_heads)
    if stacked_family(net) is not None:
        return StackRecorder(net, depths, n_heads)
    return EagerRecorder(len(depths), n_heads)
