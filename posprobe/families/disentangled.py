"""Content-free scores of DeBERTa disentangled attention (SPEC §9), as the v2/v3 and the v1 `DisentangledSelfAttention`
compute them.

Float64 numpy through the model reader (bucket arithmetic in torch, as the model does it); no model is built.
Shapes: n positions, d hidden width, H heads, d_h head size
(`attention_head_size`, default d / H), S = `att_span` (`position_buckets` if > 0, else `max_relative_positions`),
R (2S, d) the relative embeddings. Per-head weights as `HeadWeights`: q_h = x @ Wq[h] + bq[h].

DeBERTa writes relative positions as r(i, j) = i - j (log-bucketed when `position_buckets` > 0); posprobe's
offset is k = j - i = -r. With delta(i, j) = clamp(r(i, j) + S, 0, 2S - 1) (the model's own index):

    F[h, i, j] = ( q_i . k_j                       content-to-content
                 + q_i . pk[delta(i, j)]           content-to-position  (if 'c2p' in pos_att_type)
                 + k_j . pq[delta'(j, i)] ) / s    position-to-content  (if 'p2c'), delta'(j, i) = clamp(-r(j, i) + S)

with pk = LN(R) Wpk^T + bpk, pq = LN(R) Wpq^T + bpq (`share_att_key`: the content projections Wk, Wq instead;
LN only if `norm_rel_ebd` contains 'layer_norm') and s = sqrt(d_h * (1 + #terms)), which the model rounds to
float32 (so does posprobe). The bucket logarithms are float32 as in the model. The layer input x (n, d) is the
embedding output for a sequence of the average word: LayerNorm(embed_proj(e_w [+ E_P[i]] [+ token type 0])).

DeBERTa v1 is the same computation in another layout (the family entry says which): a fused per-head in_proj
with the query's bias stored apart (q_bias, no key bias), pos_proj (no bias) and pos_q_proj, no log buckets and
no relative-embedding norm, a span of min(n, max_relative_positions) rows around the middle of R (the same
indices as above), s counting every listed term (`tensors['scale_terms']`), and talking heads where stored
(head_logits_proj mixes the heads' scores before softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posprobe.architectures.config import config_int
from posprobe.errors import PosprobeError
from posprobe.families.context import HeadWeights, head_split


@dataclass(frozen=True)
class DisentangledConfig:
    """The config fields the attention reads, resolved as the module resolves them."""

    n_heads: int
    head_size: int
    pos_att_type: tuple[str, ...]
    position_buckets: int  # <= 0: no log buckets
    max_relative_positions: int  # already defaulted to max_position_embeddings when < 1
    share_att_key: bool

    @property
    def att_span(self) -> int:
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def scale_factor(self) -> int:
        return 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)

    @property
    def scale(self) -> float:
        """sqrt(d_h * scale_factor), rounded to float32 as `scaled_size_sqrt` does."""
        return float(torch.sqrt(torch.tensor(self.head_size, dtype=torch.float32) * self.scale_factor))


def log_bucket(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa's log buckets of relative positions (long in, long out; odd in its argument).

    |r| < bucket_size / 2 stays itself; larger |r| map to sign(r) * (mid + ceil(log(|r|/mid) / log((max-1)/mid) *
    (mid - 1))) with mid = bucket_size // 2, computed in float32 as the model does.
    """
    relative = torch.as_tensor(relative, dtype=torch.long)
    sign = torch.sign(relative)
    mid = bucket_size // 2
    small = (relative < mid) & (relative > -mid)
    abs_pos = torch.where(small, torch.full_like(relative, mid - 1), relative.abs())
    denominator = torch.log(torch.tensor((max_position - 1) / mid, dtype=torch.float32))
    log_pos = torch.ceil(torch.log(abs_pos.to(torch.float32) / mid) / denominator * (mid - 1)) + mid
    bucket = torch.where(abs_pos <= mid, relative.to(torch.float32), log_pos * sign)
    return bucket.to(torch.long)


def relative_positions(n: int, cfg: DisentangledConfig) -> torch.Tensor:
    """(n, n) long r(i, j) = i - j, log-bucketed when the config asks for it (`build_relative_position`)."""
    pos = torch.arange(n)
    rel = pos[:, None] - pos[None, :]
    if cfg.position_buckets > 0 and cfg.max_relative_positions > 0:
        rel = log_bucket(rel, cfg.position_buckets, cfg.max_relative_positions)
    return rel


def disentangled_scores(
    layer_input: np.ndarray,
    weights: HeadWeights,
    rel_embeddings: np.ndarray,
    cfg: DisentangledConfig,
    pos_query: HeadWeights | None = None,
    pos_key: HeadWeights | None = None,
    scale: float | None = None,
) -> np.ndarray:
    """Content-free pre-softmax scores (H, n, n) of one DeBERTa-v2/v3 layer.

    `layer_input` (n, d); `weights` the layer's per-head query/key projections; `rel_embeddings` (>= 2S, d) =
    `encoder.rel_embeddings.weight`, already through `encoder.LayerNorm` when `norm_rel_ebd` says so;
    `pos_query` / `pos_key` = `pos_query_proj` / `pos_key_proj` per head (unused with share_att_key); `scale`
    the divisor s (default `cfg.scale`: v2's count of terms).
    """
    x = layer_input
    n = x.shape[0]
    q, k = weights.queries(x), weights.keys(x)  # (H, n, d_h)
    scale = cfg.scale if scale is None else scale
    scores = q @ k.transpose(0, 2, 1) / scale
    if not set(cfg.pos_att_type) & {"c2p", "p2c"}:
        return scores
    span = cfg.att_span
    rel = rel_embeddings[: 2 * span]  # (2S, d)
    r = relative_positions(n, cfg).numpy()  # (n, n), r[i, j] for i - j
    heads = q.shape[0]
    if "c2p" in cfg.pos_att_type:
        pk = (weights if cfg.share_att_key else pos_key).keys(rel)  # (H, 2S, d_h)
        index = np.clip(r + span, 0, 2 * span - 1)  # (n, n)
        c2p = q @ pk.transpose(0, 2, 1)  # (H, n, 2S)
        scores = scores + np.take_along_axis(c2p, np.broadcast_to(index, (heads, n, n)), -1) / scale
    if "p2c" in cfg.pos_att_type:
        pq = (weights if cfg.share_att_key else pos_query).queries(rel)
        index = np.clip(-r + span, 0, 2 * span - 1)  # row = key position j, column = query position i
        p2c = k @ pq.transpose(0, 2, 1)  # (H, n_keys, 2S)
        scores = scores + np.take_along_axis(p2c, np.broadcast_to(index, (heads, n, n)), -1).transpose(0, 2, 1) / scale
    return scores


# ------------------------------------------------------------------ checkpoint access (through the family table)
def content_free_scores(ctx, layer: int, n: int, stack: str = "encoder", inputs=None):
    """F_hat (H, n, n) float64 numpy of DeBERTa `layer` (`ModelContext`, SPEC §9).

    Entry: `position` (read only when `position_biased_input`); `tensors` 'rel_embeddings', 'rel_norm' (prefix of
    `encoder.LayerNorm`, v2), 'pos_query' / 'pos_key' (prefixes of the unshared position projections, `{l}`),
    'head_logits' (v1's talking heads, where stored). `inputs`: data-conditioned layer inputs (`LayerInputs`,
    SPEC §13) or None.
    """
    f, raw = ctx.family, ctx.config
    cfg = config_from(raw, ctx.source.name, ctx.shape.head_dim)
    positions = None
    if f.position and ctx.switched_on("position"):
        positions = ctx.tensor(f.position)[:n]
        if positions.shape[0] < n:
            raise PosprobeError(
                f"checkpoint '{ctx.source.name}' has {positions.shape[0]} absolute positions, fewer than {n}",
                "analyse fewer positions with --positions",
            )
    x = np.broadcast_to(ctx.layer_rows(layer, stack, positions, inputs), (n, ctx.shape.hidden))
    rel = ctx.tensor(f.tensors["rel_embeddings"])
    if rel.shape[0] < 2 * cfg.att_span:
        raise PosprobeError(
            f"checkpoint '{ctx.source.name}' has {rel.shape[0]} relative embeddings; its config needs "
            f"{2 * cfg.att_span}",
            "the weights do not match config.json; re-save the checkpoint",
        )
    if "rel_norm" in f.tensors and "layer_norm" in _norm_rel_ebd(raw):
        rel = ctx.norm(rel, f.tensors["rel_norm"])
    heads, size = ctx.shape.heads, ctx.shape.head_dim

    def projection(name: str) -> HeadWeights:  # a position projection, per head (as both queries and keys)
        w, b = ctx.linear(f.tensors[name], layer, stack)
        per, bias = head_split(w, b, heads, size)
        return HeadWeights(per, bias, per, bias, layer)

    shared = cfg.share_att_key
    pos_query = None if shared or "p2c" not in cfg.pos_att_type else projection("pos_query")
    pos_key = None if shared or "c2p" not in cfg.pos_att_type else projection("pos_key")
    scores = disentangled_scores(x, ctx.attention(layer, stack), rel, cfg, pos_query=pos_query, pos_key=pos_key,
                                 scale=1.0 / ctx.scaling)  # fmt: skip
    mix = ctx.optional(f.tensors["head_logits"] + ".weight", layer, stack) if "head_logits" in f.tensors else None
    return scores if mix is None else np.einsum("gh,hij->gij", mix, scores)  # talking heads: a Linear over heads


def config_from(raw: dict, name: str, head_size: int | None = None) -> DisentangledConfig:
    """`DisentangledConfig` of a config.json dict, defaulted as the module defaults it, every field checked."""
    n_heads = config_int(raw, name, "num_attention_heads")
    hidden = config_int(raw, name, "hidden_size")
    head_size = head_size or config_int(raw, name, "attention_head_size", default=hidden // n_heads)
    kinds = raw.get("pos_att_type") or []
    if isinstance(kinds, str):
        kinds = [x.strip() for x in kinds.lower().split("|")]
    if not isinstance(kinds, list) or any(k not in ("c2p", "p2c", "p2p") for k in kinds):
        raise PosprobeError(
            f"config.json of '{name}' has pos_att_type = {raw.get('pos_att_type')!r}, expected 'c2p', 'p2c' or both",
            "fix config.json (DeBERTa-v3: 'p2c|c2p')",
        )
    max_rel = config_int(raw, name, "max_relative_positions", default=-1, minimum=None)
    if max_rel < 1:
        max_rel = config_int(raw, name, "max_position_embeddings", default=512)
    return DisentangledConfig(
        n_heads=n_heads,
        head_size=head_size,
        pos_att_type=tuple(kinds),  # 'p2p' is accepted and ignored, as by the module
        position_buckets=config_int(raw, name, "position_buckets", default=-1, minimum=None),
        max_relative_positions=max_rel,
        share_att_key=bool(raw.get("share_att_key", False)),
    )


def _norm_rel_ebd(raw: dict) -> list[str]:
    return [x.strip() for x in str(raw.get("norm_rel_ebd") or "none").lower().split("|")]


def toeplitz_by_construction(ctx, stack: str = "encoder", conditioned: bool = False) -> bool:
    """For an input that is the same at every position, content-to-content is a constant and the position terms
    are indexed by the bucket of i - j: Toeplitz unless an absolute table is added to the input
    (`position_biased_input`, DeBERTa-v2's default; v3 turns it off) — or the input is a data-conditioned mean
    (SPEC §13), which already holds the table."""
    return not ctx.config.get("position_biased_input", True) or conditioned
