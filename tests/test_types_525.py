"""transformers 5.25's new model types (issue 44) beyond their parity cases in tests/family_models.py: files as their
causal LMs save them (the checkpoints' own tensor names) read as the loaded models, and Kolibri 1.1's content-free key
selection against its own indexer module over longer sequences and other budgets than the parity case's."""

from __future__ import annotations

import numpy as np
import pytest

import posprobe

# model type -> a tensor name of layer 1 as its causal LM's files hold it (transformers renames it on load)
SAVED_AS = {
    "ergo": "layers.1.attention.wqkv.weight",  # one Linear [q; k; v] (loaded: self_attn.qkv_proj)
    "param2moe": "model.layers.1.attention.query_key_value.weight",  # Sarvam-MoE's names (loaded: q/k/v_proj)
    "minicpm5_moe": "model.layers.1.self_attn.q_proj.weight",  # [q_h; gate_h] rows (loaded: q_gate_proj)
}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(SAVED_AS))
def test_files_saved_by_the_causal_lm_read_as_the_loaded_model(model_type, tmp_path):
    import torch
    from family_models import build
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base = build(model_type)
    torch.manual_seed(1)
    lm = AutoModelForCausalLM.from_config(base.config, experts_implementation="eager").double().eval()
    lm.model.load_state_dict(base.state_dict())
    lm.save_pretrained(tmp_path / "lm")
    with safe_open(str(tmp_path / "lm" / "model.safetensors"), "np") as f:
        assert SAVED_AS[model_type] in set(f.keys())
    on_disk = posprobe.fhat(str(tmp_path / "lm"), layer=1, positions=12).matrices
    loaded = posprobe.fhat(base, layer=1, positions=12).matrices
    np.testing.assert_allclose(on_disk, loaded, rtol=1e-9, atol=1e-12)
    assert np.std(loaded) > 0


@pytest.mark.parametrize(
    "budget",
    [
        dict(index_topk=4, index_num_local_tokens=3, index_num_sink_tokens=1, index_pool_size=8, index_compression=2),
        dict(index_topk=5, index_num_local_tokens=4, index_num_sink_tokens=3, index_pool_size=12, index_compression=4),
        dict(index_topk=9, index_num_local_tokens=2, index_num_sink_tokens=0, index_pool_size=6, index_compression=3),
        dict(index_topk=6, index_num_local_tokens=2, index_num_sink_tokens=2, index_pool_size=4, index_compression=2),
    ],
)
def test_kolibri_selection_is_its_indexers_on_a_constant_sequence(budget):
    """On the content-free input every query and key is one vector: the module's own indexer (scores, pool, ties)
    keeps exactly the keys `sink_local.selection` says, for every query of 40 positions (causal mask)."""
    import torch
    from transformers import Kolibri1_1Config
    from transformers.models.kolibri1_1.modeling_kolibri1_1 import Kolibri1_1Indexer

    from posprobe.families.sink_local import selection

    n = 40
    config = Kolibri1_1Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              num_hidden_layers=2, layer_types=["sliding_attention", "indexed_attention"],
                              sliding_window=5, index_num_heads=2, **budget)  # fmt: skip
    indexer = Kolibri1_1Indexer(config, layer_idx=1)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(4, 16, generator=generator, dtype=torch.float64)  # one vector per head, at every position
    key = torch.randn(2, 16, generator=generator, dtype=torch.float64)
    queries, keys = query[None, :, None].expand(1, 4, n, 16), key[None, :, None].expand(1, 2, n, 16)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    picked, _ = indexer(queries, keys, causal)

    class Ctx:  # what `selection` reads: the transformers config
        transformers_config = config

    ours = selection(Ctx, n)
    np.testing.assert_array_equal(ours, picked[0, 0].numpy())
    assert (ours.sum(-1) < np.arange(1, n + 1)).any()  # some queries keep fewer keys than they see
