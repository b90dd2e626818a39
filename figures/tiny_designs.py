"""Tiny RANDOM models of the newest position designs, for the README's figures where no real checkpoint is available
offline: `python figures/tiny_designs.py OUT` saves one seeded random model per design under OUT/tiny-random-<name>.
Their weights are random (torch.manual_seed(0)): the figures show what each design does to the scores' structure
(a NoPE layer's flat profile, MLA's rotary part, a hybrid's layers without attention), not what a trained model
learned.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)  # fmt: skip
DESIGNS = {
    # NoPE every fourth layer (layer 3), rotary theta 10000 in the others
    "smollm3": ("smollm3", dict(BASE, rope_theta=10000.0)),
    # multi-head latent attention: 8 rotary dims and 16 position-free dims per head
    "deepseek_v3": ("deepseek_v3", dict(BASE, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32,
                                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=2,
                                        num_experts_per_tok=1, first_k_dense_replace=4, moe_intermediate_size=32,
                                        n_group=1, topk_group=1)),
    # a hybrid: short convolutions in layers 0 and 2, rotary attention in layers 1 and 3
    "lfm2": ("lfm2", dict(BASE, layer_types=["conv", "full_attention", "conv", "full_attention"])),
}  # fmt: skip


def main(out: str) -> None:
    for name, (model_type, config) in DESIGNS.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
        model.save_pretrained(Path(out) / f"tiny-random-{name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "posprobe-out/tiny-random")
