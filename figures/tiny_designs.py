"""Tiny RANDOM models of the newest position designs, for the README's figures where no real checkpoint is available
offline: `python figures/tiny_designs.py OUT` saves one seeded random model per design under OUT/tiny-random-<name>,
each with a byte-level tokenizer (every UTF-8 byte one token, no merges: built here, nothing downloaded) so that
`posprobe attention` runs them on text. Their weights are random (torch.manual_seed(0)): the figures show what each
design does to the scores' structure and to attention on text (a NoPE layer's flat profile, MLA's rotary part, a
hybrid's layers without attention, a learned sink's share), not what a trained model learned.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

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
    # learned sinks: one sink logit per head, sliding (window 32) and global layers in turn
    "gpt_oss": ("gpt_oss", dict(BASE, head_dim=16, num_local_experts=2, num_experts_per_tok=1, sliding_window=32,
                                layer_types=["sliding_attention", "full_attention"] * 2,
                                rope_parameters=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                                     original_max_position_embeddings=64, rope_theta=10000.0))),
}  # fmt: skip
SPECIAL = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2; the 256 bytes follow


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Every UTF-8 byte one token (ids 3..258, GPT-2's byte-to-character map), no merges; pad 0, BOS 1, EOS 2."""
    vocab = {token: i for i, token in enumerate(SPECIAL)}
    vocab |= {char: len(SPECIAL) + i for i, char in enumerate(sorted(ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def main(out: str) -> None:
    for name, (model_type, config) in DESIGNS.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
        model.save_pretrained(Path(out) / f"tiny-random-{name}")
        byte_tokenizer().save_pretrained(Path(out) / f"tiny-random-{name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "posprobe-out/tiny-random")
