"""A gated mix of hyper-connection streams (Qwen4-Exp): the model carries N residual streams of width d, and each
attention layer reads one vector mixed from them, with no input norm of its own.

The mix of layer l (`Family.tensors['stream_mix']`: a grouped norm `hc_norm` (N d,), Linears without biases
`input_mix_weight_down` (r, N d) and `input_mix_weight_up` (N d, r)) of the streams s_1 .. s_N, each (d,):
- y_c = norm(s_c) (1 + w_c): the family's RMS norm over each stream's d features, stream c's own weights w_c;
- a = sigmoid(W_up silu(W_down [y_1; ..; y_N] / N)), (N d,), one gate a_c (d,) per stream;
- the layer reads (1 / N) sum_c a_c * y_c (a mean over the streams, gated feature by feature).

SPEC §9: the model copies the embedding into every stream, so on the embedding-level input every stream holds the
average word e_w and the layer reads the mix of N copies of it (computed as above, not a shortcut: the gates and
each stream's norm weights differ). The module normalises in float32; this reads in float64.

Shapes: d hidden width, N streams; `ctx` a `posprobe.families.context.ModelContext`.
"""

from __future__ import annotations

import numpy as np

from posprobe.families.embeddings import apply_norm


def gated_stream_mix(ctx, layer: int, x: np.ndarray, stack: str = "encoder") -> np.ndarray:
    """What stored layer `layer` reads from N streams that each hold the rows x (..., d): (..., d)."""
    prefix = ctx.family.tensors["stream_mix"] + "."
    weight = ctx.tensor(prefix + "hc_norm.weight", layer, stack)  # (N d,)
    streams = weight.shape[0] // x.shape[-1]
    normed = apply_norm(x[..., None, :], ctx.family.norm, weight.reshape(streams, -1), None, ctx.shape.eps)
    flat = normed.reshape(*x.shape[:-1], -1)  # (..., N d): [y_1; ..; y_N]
    hidden = flat @ ctx.tensor(prefix + "input_mix_weight_down.weight", layer, stack).T / streams
    hidden = hidden / (1.0 + np.exp(-hidden))  # silu
    gates = 1.0 / (1.0 + np.exp(-(hidden @ ctx.tensor(prefix + "input_mix_weight_up.weight", layer, stack).T)))
    return (gates.reshape(normed.shape) * normed).mean(-2)
