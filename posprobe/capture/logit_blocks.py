"""The loss of one batch of windows (`posprobe context`, the run loop's "loss"), with the logits computed in blocks
of positions (SPEC §17).

A causal LM's forward pass returns its logits for every position at once, B x L x V numbers: at 32,768 tokens and a
262,144-token vocabulary, 32 GiB. Here the model runs once per batch as usual, but its output embedding (the LM head)
is given no positions on that pass (a forward pre-hook keeps zero of them), and the decoder's last hidden states are
kept (a forward hook on the model's base model). Then, block by block of positions, the model's own forward is called
again with its base model replaced by one that returns those hidden states' block: the LM's own code after its
decoder (scaling, LM head, soft-capping, vocabulary trimming) makes that block's logits, which are reduced at once to
float64 losses and dropped. So no user's memory holds more than `LOGIT_BLOCK_BYTES` of logits, and the losses are the
model's own. A batch whose logits fit in one block runs the plain forward pass, as before (the same numbers).

Dimensions: B windows in a batch, L tokens per window, V vocabulary, d hidden size, T positions of a block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posprobe.analysis.context_loss import position_nll, token_nll

LOGIT_BLOCK_BYTES = 256 * 2**20  # logits of one block of positions, at 4 bytes a number: B x T x V x 4 at most
CALIBRATION = 3  # peak / one block's logits: the logits, the LM's soft-capping or scaling copies, the reduction's


def block_positions(batch: int, length: int, vocab: int, budget: int = LOGIT_BLOCK_BYTES) -> int:
    """T: positions per block so that B x T x V float32 logits stay within `budget` (at least 1, at most L)."""
    return int(min(length, max(1, budget // max(1, 4 * batch * vocab))))


def context_batch_bytes(config: Any, batch: int, length: int) -> int:
    """At least what one batch of `context` takes beside the weights: one block of logits and its temporaries
    (`CALIBRATION` x B x T x V x 4) and the activations of one layer (B x L x (4 d + 3 d_ff) x 4: queries, keys,
    values, output, and the MLP's three intermediate tensors), from a transformers config or a config dict."""

    def read(*keys: str) -> int:
        for key in keys:
            value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return 0

    vocab = read("vocab_size", "padded_vocab_size")
    hidden = read("hidden_size", "n_embd", "d_model")
    inner = read("intermediate_size", "n_inner", "ffn_dim") or 4 * hidden
    block = block_positions(batch, length, vocab)
    return int(CALIBRATION * 4 * batch * block * vocab + 4 * batch * length * (4 * hidden + 3 * inner))


def window_loss(net, ids, device, budget: int = LOGIT_BLOCK_BYTES, call=None) -> np.ndarray:
    """(B, L-1) float64 losses -log p(x[t+1] | x[0..t]) of one batch of windows `ids` (B, L) on `device`: one
    forward pass, `call(**inputs)` (default `net(**inputs)`; the run loop's passes its edits on); its logits reduced
    at once where they fit in `budget` bytes, else block by block of positions (`block_positions`), the decoder run
    once."""
    import torch

    call = call if call is not None else net
    batch = torch.as_tensor(ids, device=device)
    vocab = _vocab(net)
    block = block_positions(batch.shape[0], batch.shape[1] - 1, vocab, budget) if vocab else batch.shape[1]
    with torch.inference_mode():
        if block >= batch.shape[1] - 1:
            return token_nll(call(input_ids=batch, use_cache=False).logits, batch)
        try:
            return _blocked_loss(net, batch, block, call)
        except (AttributeError, TypeError, KeyError, IndexError) as err:  # an LM whose forward reads its base model
            raise _no_blocks(net) from err  # otherwise than through its output's first field


def _blocked_loss(net, batch, block: int, call) -> np.ndarray:
    """`window_loss` block by block of `block` positions: the decoder run once (by `call`), the head once per block."""
    hidden, base_name = _hidden_states(net, batch, call)
    nll = np.empty((batch.shape[0], batch.shape[1] - 1), dtype=np.float64)
    for start in range(0, batch.shape[1] - 1, block):
        end = min(start + block, batch.shape[1] - 1)
        logits = _head_logits(net, base_name, hidden[:, start:end], batch[:, start:end])
        nll[:, start:end] = position_nll(logits, batch[:, start + 1 : end + 1])
        del logits
    return nll


def _vocab(net) -> int:
    """V: the rows of the model's output embedding (0 where it has none to read)."""
    head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None and weight.ndim == 2 else 0


def _base_name(net) -> str:
    """The attribute of `net` that holds its base model (the decoder whose last hidden states the head reads)."""
    base = net.base_model
    for name, child in net.named_children():
        if child is base:
            return name
    raise _no_blocks(net)


def _no_blocks(net):
    from posprobe.errors import PosprobeError

    return PosprobeError(
        f"'{type(net).__name__}' has no base model and LM head posprobe can run apart, and its logits for one batch "
        "do not fit in memory at once",
        "use shorter --lengths or a smaller --batch-size",
    )


def _hidden_states(net, batch, call):
    """(the base model's last hidden states (B, L, d), the base model's attribute name) from one forward pass of
    `net` in which the LM head is given no positions."""
    name = _base_name(net)
    head = net.get_output_embeddings()
    kept = {}

    def keep(module, args, output):
        kept["hidden"] = output[0]

    def nothing(module, args):
        return (args[0][:, :0], *args[1:])

    hooks = [getattr(net, name).register_forward_hook(keep), head.register_forward_pre_hook(nothing)]
    try:
        call(input_ids=batch, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    if "hidden" not in kept or kept["hidden"].shape[:2] != batch.shape:
        raise _no_blocks(net)
    return kept["hidden"], name


class _Hidden:
    """A stand-in for a base model: returns the given hidden states whatever it is called with, in an output whose
    other fields (cache, attentions, a mixture of experts' router logits, ...) are all None."""

    def __init__(self, hidden):
        self.hidden = hidden

    def __call__(self, *args, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

        class Output(BaseModelOutputWithPastAndCrossAttentions):
            def __getattr__(self, name):
                return None

        return Output(last_hidden_state=self.hidden)


def _head_logits(net, base_name: str, hidden, ids):
    """The logits (B, T, V) of hidden states (B, T, d) of a block, by `net`'s own forward with its base model replaced
    by one that returns them (`ids` (B, T) the block's tokens, read by nothing but the forward's shape checks)."""
    base = net._modules[base_name]
    net._modules[base_name] = _Hidden(hidden)
    try:
        logits = net(input_ids=ids, use_cache=False).logits
    finally:
        net._modules[base_name] = base
    if logits.shape[:2] != hidden.shape[:2]:
        raise _no_blocks(net)
    return logits
