"""A block of layers run several times in a row (Inkling 2 Loop, `Family.tensors['loop']`): which stored layer, and
which pass of it, each of posprobe's layers (depths) is."""

from __future__ import annotations


def loop_depth(ctx, layer: int) -> tuple[int, int]:
    """(stored layer, pass) of depth `layer` where a block of layers runs several times (`tensors['loop']`: config
    keys of the block's first layer, of the layer after its last and of the passes; Inkling 2 Loop). Depths number
    the calls as the model makes them: the layers before the block, the block once per pass, the layers after it.
    `ctx` a `posprobe.families.context.ModelContext`."""
    cfg = ctx.transformers_config
    start, end, passes = (int(getattr(cfg, key)) for key in ctx.family.tensors["loop"].split(","))
    size = end - start
    if layer < end:
        return layer, 0
    if layer < end + (passes - 1) * size:
        earlier, inner = divmod(layer - end, size)
        return start + inner, earlier + 1
    return layer - (passes - 1) * size, 0
