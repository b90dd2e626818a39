"""Content-free scores of bucketed relative-bias attention: T5 / mT5 / UMT5 (encoder and decoder) and MPNet (SPEC §9).

Pure torch float64 functions; no model is built. Shapes: n positions, d model width, H heads, d_kv head size,
B buckets. Weights use torch's Linear layout (out, in): q = x @ Wq.T + bq; head h owns output features
h*d_kv .. (h+1)*d_kv - 1. Row i is the query position, column j the key position, offset k = j - i.

T5     F[h, i, j] = q_h . k_h + bias[bucket(j - i), h],   q = Wq rms(e_w), k = Wk rms(e_w)   (no 1/sqrt(d_kv))
       The relative bias table (B, H) is stored in layer 0 of each stack and reused by every layer (T5, mT5);
       UMT5 stores one table per layer. The decoder's buckets are causal: every k > 0 falls in bucket 0 (as k = 0)
       and the model masks those pairs; only k <= 0 carries meaning there.
MPNet  F[h, i, j] = (x_i Wq_h^T + bq_h) . (x_j Wk_h^T + bk_h) / sqrt(d_kv) + bias[bucket(j - i), h],
       x = LayerNorm(e_w + E_P[i + 2]) (faithful mode of SPEC §3: MPNet's position ids start at padding_idx + 1 = 2),
       one bias table (32, H) for the whole encoder, buckets always 32 and max distance 128 (the module's defaults,
       whatever the config says).

Precision: transformers computes the buckets' logarithms in float32 (reproduced here, so that no bucket edge can
move) and T5's RMS variance in float32 even for float64 weights (not reproduced: posprobe keeps float64,
a relative difference of about 1e-7 in the q . k constant).
"""

from __future__ import annotations

import math

import torch

from posprobe.checkpoint.architectures import reserved_rows
from posprobe.checkpoint.config import config_int
from posprobe.errors import ArgumentValueError, PosprobeError

MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128


def relative_offsets(n: int) -> torch.Tensor:
    """(n, n) long matrix of k = j - i."""
    pos = torch.arange(n)
    return pos[None, :] - pos[:, None]


def t5_bucket(offset: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bucket index (long, same shape) of each relative offset k = j - i, as T5's attention computes it.

    Bidirectional: half of the buckets for k <= 0, half for k > 0. Causal (decoder): only k <= 0 is resolved,
    every k > 0 lands in bucket 0. Within a half, |k| < max_exact = half / 2 gets its own bucket; larger |k|
    are binned logarithmically up to max_distance, beyond which all share the last bucket.
    """
    offset = torch.as_tensor(offset, dtype=torch.long)
    base = torch.zeros_like(offset)
    if bidirectional:
        num_buckets //= 2
        base = (offset > 0).to(torch.long) * num_buckets
        distance = offset.abs()
    else:
        distance = (-offset).clamp(min=0)
    max_exact = num_buckets // 2
    # float32 as in transformers: log(distance / max_exact) / log(max_distance / max_exact) * (buckets - max_exact)
    ratio = torch.log(distance.to(torch.float32) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (ratio * (num_buckets - max_exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return base + torch.where(distance < max_exact, distance, large)


def bucket_bias(bias_table: torch.Tensor, n: int, bidirectional: bool, num_buckets: int, max_distance: int):
    """The learned bias as a score matrix: (H, n, n), entry [h, i, j] = bias_table[bucket(j - i), h].

    `bias_table` (B, H) is the `relative_attention_bias` embedding weight.
    """
    buckets = t5_bucket(relative_offsets(n), bidirectional, num_buckets, max_distance)  # (n, n)
    return bias_table.to(torch.float64)[buckets].permute(2, 0, 1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """T5's LayerNorm (no mean subtraction, no bias) over the last axis, in float64."""
    x = x.to(torch.float64)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(torch.float64)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last axis (biased variance, as torch), float64."""
    return torch.nn.functional.layer_norm(
        x.to(torch.float64), x.shape[-1:], weight.to(torch.float64), bias.to(torch.float64), eps
    )


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(..., n, H*d_h) -> (H, ..., n, d_h)."""
    return x.reshape(*x.shape[:-1], n_heads, x.shape[-1] // n_heads).movedim(-2, 0)


def qk_scores(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    n_heads: int,
    scaling: float,
    bq: torch.Tensor | None = None,
    bk: torch.Tensor | None = None,
) -> torch.Tensor:
    """Content scores (H, n, n) = (x Wq_h^T + bq_h)(x Wk_h^T + bk_h)^T * scaling for layer input x (n, d)."""
    x = x.to(torch.float64)
    q = x @ wq.to(torch.float64).T
    k = x @ wk.to(torch.float64).T
    if bq is not None:
        q = q + bq.to(torch.float64)
    if bk is not None:
        k = k + bk.to(torch.float64)
    return (split_heads(q, n_heads) @ split_heads(k, n_heads).transpose(-1, -2)) * scaling


def t5_scores(
    word_mean: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    wq: torch.Tensor,
    wk: torch.Tensor,
    bias_table: torch.Tensor,
    n: int,
    *,
    n_heads: int,
    causal: bool,
    num_buckets: int,
    max_distance: int,
    scaling: float = 1.0,
) -> torch.Tensor:
    """Content-free scores (H, n, n) of one T5 / mT5 / UMT5 self-attention layer.

    `word_mean` (d,) = vocabulary-average row of the shared embedding; `norm_weight` (d,) = the layer's
    self-attention `layer_norm.weight`; `wq`, `wk` (H*d_kv, d); `bias_table` (B, H) = the stack's layer-0
    `relative_attention_bias.weight` (T5, mT5) or this layer's own (UMT5). `causal` = decoder stack.
    The content part q . k * scaling is the same for every (i, j); T5's scaling is 1 (the table's 'none').
    """
    x = rms_norm(word_mean, norm_weight, norm_eps)  # (d,)
    q = split_heads(x @ wq.to(torch.float64).T, n_heads)  # (H, d_kv)
    k = split_heads(x @ wk.to(torch.float64).T, n_heads)
    content = (q * k).sum(-1) * scaling  # (H,)
    return content[:, None, None] + bucket_bias(bias_table, n, not causal, num_buckets, max_distance)


def mpnet_layer_input(
    word_mean: torch.Tensor, positions: torch.Tensor, layernorm: tuple[torch.Tensor, torch.Tensor, float]
) -> torch.Tensor:
    """MPNet's embedding output for a sequence of the average word: LayerNorm(e_w + E_P[i]) (n, d).

    `positions` (n, d) = the position table with its 2 reserved leading rows already dropped.
    """
    return layer_norm(positions.to(torch.float64) + word_mean.to(torch.float64), *layernorm)


def mpnet_scores(
    layer_input: torch.Tensor,
    wq: torch.Tensor,
    bq: torch.Tensor,
    wk: torch.Tensor,
    bk: torch.Tensor,
    bias_table: torch.Tensor,
    *,
    n_heads: int,
) -> torch.Tensor:
    """Content-free scores (H, n, n) of one MPNet layer: scaled q . k plus the encoder's bucket bias.

    `layer_input` (n, d) from `mpnet_layer_input`; `bias_table` (32, H) = `encoder.relative_attention_bias.weight`.
    """
    n, d = layer_input.shape
    content = qk_scores(layer_input, wq, wk, n_heads, 1.0 / math.sqrt(d // n_heads), bq, bk)
    return content + bucket_bias(bias_table, n, True, MPNET_BUCKETS, MPNET_MAX_DISTANCE)


# ------------------------------------------------------------------ checkpoint access (through the family table)
def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder"):
    """F_hat (H, n, n) float64 numpy of `layer` of `stack` (`ModelContext`, SPEC §9): T5 family or MPNet.

    The entry's `tensors['relative_bias']` names the (B, H) table (T5/mT5: layer 0's of the stack, UMT5: `{l}`'s);
    MPNet also reads its absolute table (`position`, rows after the 2 reserved ones) and embedding LayerNorm.
    """
    f, cfg, name = ctx.family, ctx.config, ctx.source.name
    table = _t(ctx.tensor(f.tensors["relative_bias"], layer, stack))
    if table.ndim != 2 or table.shape[1] != ctx.shape.heads:
        raise _malformed(ctx, f"relative attention bias of shape {tuple(table.shape)}, expected (buckets, heads)")
    wq = _t(ctx.tensor(f.query + ".weight", layer, stack))
    wk = _t(ctx.tensor(f.key + ".weight", layer, stack))
    if ctx.family.name == "mpnet":
        reserved = reserved_rows(cfg, name)
        positions = _t(ctx.tensor(f.position))[reserved : reserved + n]
        if positions.shape[0] < n:
            raise ArgumentValueError(
                "positions",
                f"{n} positions do not fit '{name}': its position table has {positions.shape[0]} usable rows "
                f"(after {reserved} reserved ones)",
                f"use {{arg}} between 2 and {positions.shape[0]}",
            )
        if table.shape[0] < MPNET_BUCKETS:
            raise _malformed(ctx, f"relative attention bias with {table.shape[0]} buckets, MPNet uses {MPNET_BUCKETS}")
        norm = (
            _t(ctx.tensor(f.embedding_norm + ".weight")),
            _t(ctx.tensor(f.embedding_norm + ".bias")),
            ctx.shape.eps,
        )
        x = mpnet_layer_input(_t(ctx.word_mean), positions, norm)
        bq, bk = (_t(ctx.optional(p + ".bias", layer, stack)) for p in (f.query, f.key))
        return mpnet_scores(x, wq, bq, wk, bk, table, n_heads=ctx.shape.heads).numpy()
    buckets = config_int(cfg, name, "relative_attention_num_buckets", default=32, minimum=4)
    max_distance = config_int(cfg, name, "relative_attention_max_distance", default=128, minimum=2)
    if table.shape[0] != buckets:
        raise _malformed(ctx, f"relative attention bias with {table.shape[0]} buckets, config says {buckets}")
    return t5_scores(
        _t(ctx.word_mean),
        _t(ctx.tensor(f.pre_norm + ".weight", layer, stack)),
        ctx.shape.eps,
        wq,
        wk,
        table,
        n,
        n_heads=ctx.shape.heads,
        causal=ctx.causal(stack),
        num_buckets=buckets,
        max_distance=max_distance,
        scaling=ctx.scaling,
    ).numpy()


def _t(array) -> torch.Tensor | None:
    return None if array is None else torch.from_numpy(array).to(torch.float64)


def _malformed(ctx, what: str):
    return PosprobeError(
        f"checkpoint '{ctx.source.name}' has a {what}", "the weights do not match config.json; re-save the checkpoint"
    )
