"""Content-free scores of bucketed relative-bias attention: T5 / mT5 / UMT5 (encoder and decoder), CPM-Ant and MPNet
(SPEC §9).

Bucket arithmetic in torch (as the model computes it); weights come through the model reader; no model is
built. Shapes: n positions, d model width, H heads, d_kv head size,
B buckets. Weights use torch's Linear layout (out, in): q = x @ Wq.T + bq; head h owns output features
h*d_kv .. (h+1)*d_kv - 1. Row i is the query position, column j the key position, offset k = j - i.

T5     F[h, i, j] = q_h . k_h + bias[bucket(j - i), h],   q = Wq rms(e_w), k = Wk rms(e_w)   (no 1/sqrt(d_kv))
       The relative bias table (B, H) is stored in layer 0 of each stack and reused by every layer (T5, mT5);
       UMT5 stores one table per layer. The decoder's buckets are causal: every k > 0 falls in bucket 0 (as k = 0)
       and the model masks those pairs; only k <= 0 carries meaning there.
CPM-Ant F[h, i, j] = q_h . k_h / sqrt(d_h) + bias[bucket(j - i), h] for pairs within one segment (text is one: its
       segment 2), q = Wq rms(e_w + segment_2); the table (B + S², H) holds a bias per segment pair after its B
       buckets (pairs across segments: text and the prompt tokens before it, which are further keys, not scored).
ProphetNet's decoder (main stream) F[h, i, j] = q_i . k_j / sqrt(d_kv) + (W_r x_i + b_r)[bucket(j - i) * H + h],
       x = LayerNorm(e_w + E_P[i + pad + 1]) (its own table): the bias of each bucket is read from the query's own
       input by a Linear (B H, d) per layer; causal buckets.
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

import numpy as np
import torch

from posprobe.architectures.config import config_int
from posprobe.errors import ArgumentValueError, PosprobeError
from posprobe.families.context import config_default, head_products, reserved_rows

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


def t5_scores(content: torch.Tensor, bias_table: torch.Tensor, n: int, *, causal: bool, num_buckets: int,
              max_distance: int) -> torch.Tensor:  # fmt: skip
    """Content-free scores (H, n, n) of one T5 / mT5 / UMT5 self-attention layer: the q . k * scaling of each
    head, `content` (H,) (a constant per head) or (H, 1, 1) or (H, n, n) (a per-position input), plus the
    bucketed bias (`bias_table` (B, H): the stack's layer-0 table for T5
    and mT5, this layer's own for UMT5). `causal` = decoder stack."""
    content = content.to(torch.float64)
    content = content[:, None, None] if content.ndim == 1 else content
    return content + bucket_bias(bias_table, n, not causal, num_buckets, max_distance)


def query_bucket_bias(rows, weight, bias, n: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """The bias (H, n, n) that each query's own input picks per causal bucket (ProphetNet's decoder): entry
    [h, i, j] = (W x_i + b)[bucket(j - i) * H + h], `rows` (n, d) the query inputs x_i (or (1, d), the same at every
    position), `weight` (B H, d) and `bias` (B H,) the layer's Linear, H = B H / `num_buckets`."""
    per_query = rows @ weight.T + (0.0 if bias is None else bias)  # (m, B H)
    per_query = per_query.reshape(len(rows), num_buckets, -1)  # (m, B, H): features bucket-major
    buckets = t5_bucket(relative_offsets(n), False, num_buckets, max_distance).numpy()  # (n, n)
    queries = np.arange(n)[:, None] if len(rows) == n else np.zeros((n, 1), dtype=int)
    return per_query[queries, buckets].transpose(2, 0, 1)


# ------------------------------------------------------------------ checkpoint access (through the family table)
def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None):
    """F_hat (H, n, n) float64 numpy of `layer` of `stack` (`ModelContext`, SPEC §9): T5 family or MPNet.

    The entry's `tensors['relative_bias']` names the (B, H) table (T5/mT5: layer 0's of the stack, UMT5: `{l}`'s).
    MPNet: the faithful scores of its absolute table (`position`, rows after the 2 reserved ones, through the
    embedding LayerNorm) plus the encoder's one bias table, buckets 32 and max distance 128 whatever the config.
    `inputs`: data-conditioned layer inputs (`LayerInputs`, SPEC §13) or None.
    """
    f, cfg, name = ctx.family, ctx.config, ctx.source.name
    if "relative_bias_projection" in f.tensors:  # ProphetNet's decoder: each query's input gives its biases
        return _query_bucket_scores(ctx, layer, n, stack, inputs)
    table = _t(ctx.tensor(f.tensors["relative_bias"], layer, stack))
    if table.ndim != 2 or table.shape[1] != ctx.shape.heads:
        raise _malformed(ctx, f"relative attention bias of shape {tuple(table.shape)}, expected (buckets, heads)")
    weights = ctx.attention(layer, stack)
    if f.position:  # an absolute table beside the bias (MPNet): faithful scores of the table plus the bias
        reserved = reserved_rows(cfg, name)
        positions = ctx.tensor(f.position)[reserved : reserved + n]
        if positions.shape[0] < n:
            raise ArgumentValueError(
                "positions",
                f"{n} positions do not fit '{name}': its position table has {positions.shape[0]} usable rows "
                f"(after {reserved} reserved ones)",
                f"use {{arg}} between 2 and {positions.shape[0]}",
            )
        if table.shape[0] < MPNET_BUCKETS:
            raise _malformed(ctx, f"relative attention bias with {table.shape[0]} buckets, MPNet uses {MPNET_BUCKETS}")
        x = ctx.layer_rows(layer, stack, positions, inputs)  # (n, d); (1, d) for a data-conditioned mean
        content = weights.queries(x) @ weights.keys(x).transpose(0, 2, 1) * ctx.scaling  # (H, n, n)
        bias = bucket_bias(table, n, True, MPNET_BUCKETS, MPNET_MAX_DISTANCE)
        return content + bias.numpy()
    buckets_key = f.tensors.get("num_buckets", "relative_attention_num_buckets")  # CPM-Ant: names of its own
    distance_key = f.tensors.get("max_distance", "relative_attention_max_distance")
    buckets = config_int(cfg, name, buckets_key, default=_default(cfg, buckets_key, 32), minimum=4)
    max_distance = config_int(cfg, name, distance_key, default=_default(cfg, distance_key, 128), minimum=2)
    segments = _segment_rows(cfg, f.tensors.get("segment_rows"))
    if table.shape[0] != buckets + segments:
        said = f"{buckets} + {segments} segment pairs" if segments else str(buckets)
        raise _malformed(ctx, f"relative attention bias with {table.shape[0]} buckets, config says {said}")
    table = table[:buckets]  # CPM-Ant: the buckets of pairs within a segment (text is one segment)
    q, k = ctx.query_key(layer, stack, inputs)  # (H, d_kv) each; (H, n, d_kv) for a per-position input
    content = torch.from_numpy(head_products(q, k) * ctx.scaling)  # (H, 1, 1) or (H, n, n)
    scores = t5_scores(content, table, n, causal=ctx.causal(stack), num_buckets=buckets, max_distance=max_distance)
    return scores.numpy()


def _query_bucket_scores(ctx, layer: int, n: int, stack: str, inputs) -> np.ndarray:
    """ProphetNet's decoder main stream: the faithful scores of its own table (`position`, after the reserved rows,
    through the embedding norm) plus the bias each query's input picks per bucket (`query_bucket_bias`)."""
    f, cfg, name = ctx.family, ctx.config, ctx.source.name
    x = ctx.layer_rows(layer, stack, ctx.position_table.table[:n], inputs)  # (n, d); (1, d): a data-conditioned mean
    weights = ctx.attention(layer, stack)
    content = weights.queries(x) @ weights.keys(x).transpose(0, 2, 1) * ctx.scaling  # (H, n, n) or (H, 1, 1)
    buckets = config_int(cfg, name, f.tensors["num_buckets"], default=_default(cfg, f.tensors["num_buckets"], 32),
                         minimum=2)  # fmt: skip
    distance_key = f.tensors["max_distance"]
    max_distance = config_int(cfg, name, distance_key, default=_default(cfg, distance_key, 128), minimum=2)
    w, b = ctx.linear(f.tensors["relative_bias_projection"], ctx.stored_layer(layer), stack)
    if w.shape[0] != buckets * ctx.shape.heads:
        raise _malformed(ctx, f"relative position projection of shape {w.shape}, expected ({buckets} buckets x "
                              f"{ctx.shape.heads} heads, width)")  # fmt: skip
    return content + query_bucket_bias(x, w, b, n, buckets, max_distance)


def _default(config: dict, key: str, fallback: int) -> int:
    """What the model uses for `key` where its config.json leaves it out: its config class's default (CPM-Ant's 512
    buckets), else `fallback` (T5's)."""
    if config.get(key) is not None:
        return config[key]
    value = config_default(config, (key,))
    return fallback if value is None else value


def _segment_rows(config: dict, key: str | None) -> int:
    """Rows of a segment-aware bias table after its buckets: one per (query segment, key segment) pair, config[key]
    segment types (CPM-Ant's segment_types); 0 without segments."""
    if key is None:
        return 0
    types = config.get(key)
    return int(types if types is not None else config_default(config, (key,))) ** 2


def _t(array) -> torch.Tensor | None:
    return None if array is None else torch.from_numpy(array).to(torch.float64)


def _malformed(ctx, what: str):
    return PosprobeError(
        f"checkpoint '{ctx.source.name}' has a {what}", "the weights do not match config.json; re-save the checkpoint"
    )


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """T5 / mT5 / UMT5: always, for an input that is the same at every position (a constant q . k plus
    bias[bucket(j - i)]). MPNet: not for the embedding-level input, its absolute table enters the input at each
    position; yes for a data-conditioned mean (SPEC §13), which already holds the table."""
    return not ctx.family.position or conditioned
