"""Models that pool the sequence between blocks of layers (`Family.tensors['pooled_blocks']`, Funnel): record the
self-attention of the first block, the only layers whose queries and keys are the text's positions, on the model's
own eager path.

Funnel halves the sequence before each later block (its queries sit on pooled positions of their own) and its
upsampling decoder (FunnelModel) reads the last block's output upsampled: the softmaxes of the later blocks have other
shapes, and the decoder's input comes through pooling that averages padding into real positions, so a padded batch
is not its texts alone there. posprobe's layers are the layers in the order the model runs them (every run of a
repeated layer, `block_repeats`), then the decoder's; the first block's are recorded, the others are a hybrid's other
layers (no positional score, `pooled_layer_words`). `PooledRecorder` hooks the attention module of each first-block
layer and keeps the probabilities A it returns and the input S of the one (B, H, m, m) softmax made inside it.
Funnel masks a padding key by subtracting a finite 1e6 from its score (not a dtype's minimum), so the allowed pairs
are the real keys of every query row, read from the attention mask; the first-batch checks (`EagerRecorder.verify`)
then confirm that softmax(S) gives A and that no padding key is attended.

Dimensions: B batch, H heads, m sequence length.
"""

from __future__ import annotations

from typing import Any

from posprobe.capture.eager import EagerRecorder, module_attentions
from posprobe.errors import PosprobeError


def pooled_family(model):
    """The family of `model` when it pools the sequence between blocks (`Family.tensors['pooled_blocks']`), else
    None."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(model.config, "model_type", "")))
    return family if family is not None and "pooled_blocks" in family.tensors else None


def pooled_layers(model) -> tuple[int, list[int], int]:
    """(layers of the first block, layers run by each later block, decoder layers) of a model that pools the
    sequence between blocks, in the order it runs them; the decoder's (Funnel's upsampling decoder) 0 where the model
    has none (FunnelBaseModel). PosprobeError where the first block repeats its layers (`block_repeats`), as the
    weights commands refuse it."""
    from posprobe.architectures import table as T

    family = pooled_family(model)
    config = model.config
    sizes = [int(s) for s in getattr(config, family.tensors["pooled_blocks"])]
    repeats = [int(r) for r in getattr(config, family.tensors["block_repeats"], None) or [1] * len(sizes)]
    if repeats[0] != 1:
        raise PosprobeError(
            f"'{config.model_type}' runs the layers of its first block {repeats[0]} times each "
            f"({family.tensors['block_repeats']}), which posprobe does not read",
            "use a checkpoint whose first block runs each layer once",
        )
    later = [size * repeat for size, repeat in zip(sizes[1:], repeats[1:], strict=True)]
    decoder = 0
    stack = family.decoder_stack
    if stack:
        base = getattr(model, "base_model", model)
        try:
            base.get_submodule(stack["query"].format(l=0))
            decoder = int(T.config_get(config.to_dict(), stack["sizes"]["layers"][0]) or 0)
        except AttributeError:  # FunnelBaseModel: no upsampling decoder
            decoder = 0
    return sizes[0], later, decoder


def pooled_layer_words(model) -> list[str]:
    """How each layer of a pooled model past its first block attends, in words that end in 'no positional score'
    (`families.windows.NO_SCORE`): the later blocks', then the upsampling decoder's."""
    from posprobe.families.windows import NO_SCORE

    _, later, decoder = pooled_layers(model)
    words = [
        f"block {block + 1}: queries on the sequence pooled {2 ** (block + 1)}-fold, not the text's positions: "
        f"{NO_SCORE}"
        for block, count in enumerate(later)
        for _ in range(count)
    ]
    upsampled = (
        "upsampling decoder: its input is upsampled from the pooled blocks, whose pooling averages padding into "
        f"real positions (`--stack decoder` reads its weights): {NO_SCORE}"
    )
    return words + [upsampled] * decoder


def first_block_modules(net, depths: list[int]) -> list:
    """The attention module of each of `depths` (layers of the first block) of a pooled model: the family's query
    projection name less its last part ('encoder.blocks.0.{l}.attention'), under the base model."""
    family = pooled_family(net)
    first = pooled_layers(net)[0]
    template = family.query.rsplit(".", 1)[0]
    base = getattr(net, "base_model", net)
    if any(depth >= first for depth in depths):
        raise ValueError(f"layers {depths}: only the first block's {first} layers run over the text's positions")
    return [base.get_submodule(template.format(l=depth)) for depth in depths]


class PooledRecorder(EagerRecorder):
    """The eager route for a model that pools the sequence between blocks: runs batches through its eager attention
    and returns what its first-block layers `depths` did, each from its own module."""

    def __init__(self, net, depths: list[int], n_heads: int):
        super().__init__(len(depths), n_heads)
        self.depths, self.modules = depths, first_block_modules(net, depths)

    def forward(self, model, tokens, **kwargs) -> tuple[Any, list, tuple, list]:
        """(output, scores, probs, allowed) of one `TokenBatch`, as `EagerRecorder.forward`: per recorded layer S
        and A (B, H, m, m) from its own module; the allowed pairs (B, m, m) the real keys of every query row.
        PosprobeError where a module did not make exactly one (queries x keys) softmax or returned no attention of
        that shape, or where the model fails on a batch this short."""
        batch, m = tokens.input_ids.shape

        def run():
            try:
                return model(
                    input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, output_attentions=True, **kwargs
                )
            except (
                RuntimeError
            ) as err:  # transformers' Funnel on a few tokens (separate_cls: 1 or 2; more with 3 blocks)
                what = (str(err).strip().splitlines() or [""])[0]
                raise PosprobeError(
                    f"'{model.config.model_type}' fails in its own forward pass on a batch of {m} tokens ({what}): "
                    "its pooled blocks need a longer sequence",
                    "run longer texts, or batch short texts with longer ones (a batch runs at its longest text's "
                    "length)",
                ) from err

        output, scores, probs = module_attentions(model, self.modules, self.depths, self.n_heads, batch, m, run)
        keys = tokens.attention_mask.bool()[:, None, :].expand(batch, m, m).contiguous()  # padding keys, every row
        return output, scores, probs, [keys] * len(scores)
