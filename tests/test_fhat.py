"""F_hat_P: an entry-by-entry reference, parity with the real first layer, and orientation (k = j - i)."""

import numpy as np
import pytest
from conftest import FAMILIES

from posprobe.analysis.fhat import LayerInput, fhat_matrices, paper_input
from posprobe.analysis.toeplitz import diagonal_means, offsets
from posprobe.pipelines.weights import fhat as fhat_analysis
from posprobe.pipelines.weights import open_model
from posprobe.pipelines.weights import profiles as compute_profiles


def loop_paper_fhat(positions, word, wq, wk, n_heads):
    """SPEC §3 paper formula, one entry at a time."""
    n, d = positions.shape
    dh = d // n_heads
    out = np.zeros((n_heads, n, n))
    for h in range(n_heads):
        sl = slice(h * dh, (h + 1) * dh)
        m = wq[sl].T @ wk[sl]  # W_Q,h W_K,h^T in row-vector convention (d, d)
        for i in range(n):
            for j in range(n):
                out[h, i, j] = (
                    word @ m @ positions[j] + positions[i] @ m @ word + positions[i] @ m @ positions[j]
                ) / np.sqrt(dh)
    return out


@pytest.mark.parametrize("family", ["bert", "albert", "gpt2"])
def test_paper_mode_equals_entry_loop(tiny_checkpoints, family):
    ctx = open_model(str(tiny_checkpoints[family]))
    wq, _, wk, _ = ctx.attention(0).linear()
    inp = paper_input(ctx.position_table.table[:12], ctx.word_mean, ctx.projection())
    fast = fhat_matrices(inp, wq, wk, ctx.shape.heads)
    slow = loop_paper_fhat(inp.positions, inp.word, wq, wk, ctx.shape.heads)
    np.testing.assert_allclose(fast, slow, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fhat_analysis(str(tiny_checkpoints[family]), 0, positions=12).matrices, slow,
                               rtol=1e-10, atol=1e-12)  # fmt: skip


def test_paper_mode_is_full_score_minus_word_word_constant():
    rng = np.random.default_rng(0)
    n, d, heads = 9, 12, 3
    positions, word = rng.normal(size=(n, d)), rng.normal(size=d)
    wq, wk = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    paper = fhat_matrices(LayerInput(positions=positions, word=word), wq, wk, heads)
    full = fhat_matrices(LayerInput(full=positions + word), wq, wk, heads)
    dh = d // heads
    const = np.array(
        [(word @ wq[h * dh : (h + 1) * dh].T) @ (word @ wk[h * dh : (h + 1) * dh].T) for h in range(heads)]
    ) / np.sqrt(dh)
    np.testing.assert_allclose(full - const[:, None, None], paper, atol=1e-10)


def _layer0_qk_modules(model, family):
    if family in ("bert", "roberta", "xlm-roberta"):
        a = model.encoder.layer[0].attention.self
        return a.query, a.key
    if family == "electra":
        a = model.electra.encoder.layer[0].attention.self
        return a.query, a.key
    if family == "albert":
        a = model.encoder.albert_layer_groups[0].albert_layers[0].attention
        return a.query, a.key
    if family == "distilbert":
        a = model.transformer.layer[0].attention
        return a.q_lin, a.k_lin
    return model.h[0].attn.c_attn, None


@pytest.mark.parametrize("family", FAMILIES)
def test_faithful_mode_matches_the_real_first_layer(tiny_checkpoints, tiny_models, family):
    """Feed the average word embedding at every position through the real model and capture Q, K."""
    import torch

    model = tiny_models[family].double()
    ctx = open_model(str(tiny_checkpoints[family]))
    n = ctx.position_table.n_positions
    captured = {}
    q_mod, k_mod = _layer0_qk_modules(model, family)
    hooks = [q_mod.register_forward_hook(lambda m, i, o: captured.setdefault("q", o.detach()))]
    if k_mod is not None:
        hooks.append(k_mod.register_forward_hook(lambda m, i, o: captured.setdefault("k", o.detach())))
    embeds = torch.tensor(ctx.word_mean).expand(1, n, -1).clone()
    with torch.no_grad():
        model(inputs_embeds=embeds)
    for hook in hooks:
        hook.remove()
    d = captured["q"].shape[-1] if k_mod is not None else captured["q"].shape[-1] // 3
    q = captured["q"][0, :, :d].numpy()
    k = (captured["k"][0] if k_mod is not None else captured["q"][0, :, d : 2 * d]).numpy()
    heads = model.config.num_attention_heads if hasattr(model.config, "num_attention_heads") else model.config.n_head
    dh = d // heads
    expected = np.stack(
        [q[:, h * dh : (h + 1) * dh] @ k[:, h * dh : (h + 1) * dh].T / np.sqrt(dh) for h in range(heads)]
    )
    result = fhat_analysis(str(tiny_checkpoints[family]), 0, "faithful")
    np.testing.assert_allclose(result.matrices, expected, rtol=1e-9, atol=1e-10)
    assert result.mode == "faithful"


def test_faithful_input_steps(tiny_checkpoints, tiny_models):
    """The reader's embedding rows are the real embedding module's output for the average word."""
    import torch

    ctx = open_model(str(tiny_checkpoints["bert"]))
    model = tiny_models["bert"].double()
    embeds = torch.tensor(ctx.word_mean).expand(1, 5, -1).clone()
    with torch.no_grad():
        real = model.embeddings(inputs_embeds=embeds)[0].numpy()
    np.testing.assert_allclose(ctx.embedding_rows(ctx.position_table.table[:5]), real, rtol=1e-10, atol=1e-12)


def _next_token_checkpoint(folder):
    """A BERT whose layer-0 head 0 scores (query i, key j) = 1 exactly when j = i + 1 (paper mode)."""
    import torch
    import transformers as tf

    n, d, heads = 8, 32, 4
    cfg = tf.BertConfig(
        hidden_size=d,
        num_hidden_layers=1,
        num_attention_heads=heads,
        intermediate_size=16,
        vocab_size=10,
        max_position_embeddings=n,
    )
    model = tf.BertModel(cfg)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.zero_()
        model.embeddings.token_type_embeddings.weight.zero_()
        model.embeddings.position_embeddings.weight.copy_(torch.eye(n, d) * 4.0)
        q, k = model.encoder.layer[0].attention.self.query, model.encoder.layer[0].attention.self.key
        q.weight.zero_(), k.weight.zero_(), q.bias.zero_(), k.bias.zero_()
        for a in range(n):  # head 0 owns features 0..7: q maps p_i -> u_i, k maps p_j -> u_(j-1)
            q.weight[a, a] = 3.0
            if a + 1 < n:
                k.weight[a, a + 1] = 3.0
    model.save_pretrained(folder)
    return model


def test_orientation_next_token_head_peaks_at_plus_one(tmp_path):
    import torch

    model = _next_token_checkpoint(tmp_path)
    result = compute_profiles(str(tmp_path), mode="paper", window=3)
    profile = result.profiles[0, 0]
    assert offsets(8)[np.argmax(profile)] == 1
    assert result.offsets[np.argmax(profile)] == 1
    # The real model agrees: head 0 attends from i to i + 1 (a check of the convention, not of our code).
    model.eval().set_attn_implementation("eager")
    with torch.no_grad():
        att = model(input_ids=torch.zeros(1, 8, dtype=torch.long), output_attentions=True).attentions[0][0, 0]
    assert all(int(att[i].argmax()) == i + 1 for i in range(7))


def test_profiles_are_diagonal_means_and_albert_layers_share(tiny_checkpoints):
    res = compute_profiles(str(tiny_checkpoints["albert"]), mode="paper", window=4)
    assert res.shared_layers and res.layers == [0, 1]
    np.testing.assert_array_equal(res.profiles[0], res.profiles[1])
    f = fhat_analysis(str(tiny_checkpoints["albert"]), 0, "paper").matrices
    np.testing.assert_allclose(res.profiles[0], diagonal_means(f))
    assert res.sections.shape == (2, 4, len(res.section_rows), 9)
