"""The family test matrix: tiny random models (hidden 32, 2 layers) of every analysable family of the family table,
several configs where a config switch changes how a family reads, and the reference the content-free scores must
equal: the model's own pre-softmax scores on the constant sequence of the average word, every layer fed the
embedding-level input (SPEC §9), with the pairs its softmax lets through (masks, local windows)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

SMALL = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
_XLM = dict(vocab_size=99, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64, pad_index=2, mask_index=5)
_SEQ2SEQ = dict(
    vocab_size=99,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=37,
    decoder_ffn_dim=37,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=1,
    scale_embedding=True,
)
_GPTJ = dict(
    vocab_size=99, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, bos_token_id=0, eos_token_id=0
)
_FALCON = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    bias=True,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=0,
)
_RELATIVE_OFF = dict(
    relative_attention=False,
    position_biased_input=True,
    pos_att_type="p2c|c2p",
    type_vocab_size=2,
    max_position_embeddings=64,
    intermediate_size=37,
)
_KV2 = dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
_GRANITE_HYBRID = dict(
    _KV2,
    num_hidden_layers=2,
    layer_types=["mamba", "attention"],
    mamba_n_heads=4,
    mamba_d_head=16,
    mamba_n_groups=1,
    mamba_d_state=8,
    mamba_chunk_size=8,
    num_local_experts=2,
    num_experts_per_tok=1,
    attention_multiplier=0.3,
    embedding_multiplier=2.5,
)
_LINEAR_FULL = ["linear_attention", "full_attention"]
_MLA = dict(
    num_key_value_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
    kv_lora_rank=8,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    n_routed_experts=2,
    num_experts_per_tok=1,
    first_k_dense_replace=1,
    moe_intermediate_size=16,
    n_group=1,
    topk_group=1,
)
# issue 34 (dots3): indexed MLA layers (4 of 12 dims rotate, base 1000; ranks 12 / 8) beside sliding-window layers (a
# window of 3) with sizes of their own (6 of 14 dims rotate, base 100; ranks 16 / 6); 5 of the 16 keys indexed
_DOTS3 = dict(_MLA, num_hidden_layers=4, q_lora_rank=12, head_dim=12, index_topk=5, index_n_heads=4, index_head_dim=8,
              sliding_window=3, layer_types=["indexed_attention", "sliding_attention"] * 2, rope_theta=1000.0,
              swa_rope_theta=100.0, swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_q_lora_rank=16,
              swa_kv_lora_rank=6, swa_head_dim=14, swa_qk_nope_head_dim=8, swa_v_head_dim=8,
              shared_experts_intermediate_size=16)  # fmt: skip
# weights drawn at unit scale in place of their initial 0.02, where a small one would hide a mechanism (Gemma 3n's
# AltUp mixing is within 1e-4 of the identity at 0.02)
_ALTUP = ("altup.modality_router", "altup.prediction_coefs")
# Gemma 4: global layers with heads of 16 dims (8 elsewhere), one key head, a proportional rope over half of them;
# the last two layers reuse the keys of the first two
_GEMMA4 = dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
               attention_k_eq_v=True, num_kv_shared_layers=2, max_position_embeddings=64, pad_token_id=0,
               sliding_window=5, layer_types=["sliding_attention", "full_attention"] * 2,
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                   "rope_theta": 10000.0}})  # fmt: skip
# Reformer (issue 34): local chunks of 4 (LSH chunks of 8: sequences are padded to a multiple of 8 beyond 4), heads
# of 6 (not hidden / heads), its query and key weights at unit scale (at 0.02 every score is within 0.05 of 0)
_REFORMER_QK = ("self_attention.query.", "self_attention.key.")
_REFORMER = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, attention_head_size=6, feed_forward_size=37,
                 max_position_embeddings=32, axial_pos_shape=[4, 8], axial_pos_embds_dim=[12, 20],
                 local_attn_chunk_length=4, local_num_chunks_before=1, local_num_chunks_after=1,
                 lsh_attn_chunk_length=8, num_buckets=4, hash_seed=0, pad_token_id=0)  # fmt: skip
_MUSICGEN = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37,
                 max_position_embeddings=64, num_codebooks=3, scale_embedding=True, pad_token_id=99,
                 bos_token_id=99)  # fmt: skip
# Funnel: AutoModel picks among its classes by `architectures`
_FUNNEL = dict(architectures=["FunnelModel"], vocab_size=99, d_model=32, n_head=4, d_head=8, d_inner=37,
               num_decoder_layers=1)  # fmt: skip
_GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
}
# issue 34 (mm): vision towers of one layer, the language models of multimodal wrappers
_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, image_size=16,
               patch_size=8)  # fmt: skip
_QWEN_VISION = dict(hidden_size=32, intermediate_size=48, depth=1, num_heads=4, out_hidden_size=32, patch_size=8)
_QWEN3_5_TEXT = dict(SMALL, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, head_dim=16,
                     layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4,
                     linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)  # fmt: skip
# M-RoPE: the rotary half of each head (8 dims, 4 pairs) split over the temporal, height and width axes
_MROPE = dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
              mrope_interleaved=True)  # fmt: skip
# issue 34 (qwen4): Qwen4-Exp's language model (its wrapper's text_config too)
_QWEN4_EXP_TEXT = dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       layer_types=["linear_attention", "indexed_attention"] * 2, linear_num_value_heads=4,
                       linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2,
                       num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                       hc_count=3, hc_lowrank=8, ple_layer_ids=[1], ple_embed_dim=16, heads_per_ngram=2,
                       ngram_vocab_size_base=101, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8,
                       indexer_budget=6, indexer_compress_ratio=3)  # fmt: skip
_QWEN4_EXP_ROPE = dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1])
_BLT_BYTES = dict(SMALL, num_key_value_heads=2, hidden_size_global=48)  # BLT's byte stacks (issue 34)
_ULTRABERT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                   "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}  # fmt: skip

# issue 44 (Kolibri 1.1): heads of 16 dims (its NVFP4 rounding takes blocks of 16), 2 of each key head's 2 query heads
# scoring keys for its indexer; dense MLP in layer 0
_KOLIBRI1_1 = dict(_KV2, num_hidden_layers=5, head_dim=16, sliding_window=5, num_local_experts=2,
                   num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                   mlp_only_layers=[0], mlp_only_intermediate_size=48,
                   layer_types=["sliding_attention"] + ["indexed_attention"] * 4, index_layers=[1, 3],
                   kv_source_layers=[0, 1, 2, 2, 1], index_topk=4, index_num_local_tokens=3, index_num_sink_tokens=1,
                   index_compression=2, index_num_heads=2,
                   rope_parameters=dict(rope_type="default", rope_theta=100.0))  # fmt: skip
# case -> (model_type, config[, options]): options `own` (the config is complete; else SMALL + it), `compare` ('exact'
# pre-softmax scores, or 'row': equal up to a constant per query row on the pairs the model attends), `attention`
# (the implementation whose scores are the reference: 'eager', or 'sdpa' where eager differs from the default),
# `word_id` (the token that carries the average word: 0 unless the model reads token 0 as padding, CPM-Ant),
# `boost` (names of weights drawn at unit scale), `lm` (built as its causal LM: a family without a base model class),
# `cls` (the transformers class it is built as, where no auto class maps its type)
CASES = {
    # rotary
    "llama": ("llama", dict(num_key_value_heads=2, max_position_embeddings=64, attention_bias=True,
                            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0, original_max_position_embeddings=16))),
    "mistral": ("mistral", dict(num_key_value_heads=1, max_position_embeddings=64, rope_theta=500.0,
                                sliding_window=6)),
    "mixtral": ("mixtral", dict(num_key_value_heads=2, max_position_embeddings=64, num_local_experts=2)),
    "qwen2": ("qwen2", dict(num_key_value_heads=2, max_position_embeddings=64,
                            rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16))),
    "qwen3": ("qwen3", dict(num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                            rope_scaling=dict(rope_type="linear", factor=2.0))),
    "qwen3_moe": ("qwen3_moe", dict(num_key_value_heads=2, head_dim=16, max_position_embeddings=64, num_experts=2,
                                    num_experts_per_tok=1, moe_intermediate_size=16)),
    "gemma": ("gemma", dict(num_key_value_heads=1, head_dim=8, max_position_embeddings=64)),
    "gemma2": ("gemma2", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64, query_pre_attn_scalar=6,
                              attn_logit_softcapping=3.0, sliding_window=4)),
    "gemma3_text": ("gemma3_text", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0,
                                        query_pre_attn_scalar=6, sliding_window=5, rope_parameters=_GEMMA3_ROPE,
                                        layer_types=["sliding_attention", "full_attention"])),
    "gemma3_text-bidirectional": ("gemma3_text", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                                                      pad_token_id=0, sliding_window=5,
                                                      use_bidirectional_attention=True,
                                                      layer_types=["sliding_attention", "full_attention"])),
    "phi": ("phi", dict(max_position_embeddings=64, partial_rotary_factor=0.5, qk_layernorm=True)),
    "phi3": ("phi3", dict(num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=16,
                          pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          rope_scaling=dict(type="longrope", short_factor=[1.0, 1.5, 2.0, 2.5],
                                            long_factor=[1.0, 2.0, 3.0, 4.0]))),
    "starcoder2": ("starcoder2", dict(num_key_value_heads=2, max_position_embeddings=64)),
    "gpt_neox_japanese": ("gpt_neox_japanese", dict(max_position_embeddings=64, intermediate_multiple_size=2,
                                                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                         partial_rotary_factor=0.5))),
    "gpt_neox": ("gpt_neox", dict(max_position_embeddings=64, rotary_pct=0.25, attention_bias=True)),
    "stablelm": ("stablelm", dict(num_key_value_heads=2, max_position_embeddings=64, qk_layernorm=True,
                                  use_qkv_bias=True, partial_rotary_factor=0.25)),
    "olmo": ("olmo", dict(num_key_value_heads=2, max_position_embeddings=64, clip_qkv=0.05, pad_token_id=0)),
    "olmo2": ("olmo2", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)),
    "granite": ("granite", dict(num_key_value_heads=2, max_position_embeddings=64, attention_multiplier=0.3,
                                embedding_multiplier=2.5)),
    "cohere": ("cohere", dict(num_key_value_heads=2, max_position_embeddings=64, use_qk_norm=True, pad_token_id=0)),
    "glm": ("glm", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0,
                        attention_bias=True)),
    "persimmon": ("persimmon", dict(max_position_embeddings=64, qk_layernorm=True, partial_rotary_factor=0.5)),
    # issue 34: NoPE layers (SmolLM3: no_rope_layers; Cohere 2: global layers), learned sinks (gpt-oss)
    "smollm3": ("smollm3", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                                no_rope_layers=[1, 0], rope_theta=100.0)),
    "smollm3-sliding": ("smollm3", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                                        no_rope_layers=[0, 1], use_sliding_window=True, sliding_window=12,
                                        layer_types=["sliding_attention", "full_attention"])),
    "cohere2": ("cohere2", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0,
                                sliding_window=12, layer_types=["sliding_attention", "full_attention"])),
    "cohere2_moe": ("cohere2_moe", dict(_KV2, head_dim=8, sliding_window=12, num_experts=2, num_experts_per_tok=1,
                                        layer_types=["sliding_attention", "full_attention"])),
    "cohere2_moe-rms-dense-prefix": ("cohere2_moe", dict(_KV2, head_dim=8, sliding_window=12, num_experts=2,
                                                         num_experts_per_tok=1, rms_norm_eps=1e-3,
                                                         layer_types=["full_attention", "full_attention"],
                                                         mlp_layer_types=["dense", "sparse"])),
    "gpt_oss": ("gpt_oss", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0,
                                num_local_experts=2, num_experts_per_tok=1, sliding_window=12, attention_bias=True,
                                layer_types=["sliding_attention", "full_attention"],
                                rope_parameters=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                                     truncate=False, original_max_position_embeddings=16,
                                                     rope_theta=1000.0))),
    # per-layer local / global: Olmo 3 (a rotary setting per layer type), Exaone 4 (global layers NoPE)
    "olmo3": ("olmo3", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, sliding_window=12,
                            layer_types=["sliding_attention", "full_attention"],
                            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                             "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                "rope_theta": 10000.0}})),
    "exaone4": ("exaone4", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, sliding_window=12,
                                layer_types=["sliding_attention", "full_attention"])),
    "exaone4-no-window": ("exaone4", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                                          sliding_window=None, layer_types=["full_attention", "full_attention"])),
    # hybrids: attention layers between convolution (LFM2) or state-space (Bamba, Jamba) layers
    "lfm2": ("lfm2", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, num_hidden_layers=3,
                          layer_types=["full_attention", "conv", "full_attention"], conv_L_cache=3)),
    "bamba": ("bamba", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, num_hidden_layers=2,
                            attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
                            mamba_d_state=8, mamba_chunk_size=8, partial_rotary_factor=0.5)),
    "jamba": ("jamba", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, num_hidden_layers=2,
                            attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4, expert_layer_offset=3,
                            num_experts=1, mamba_d_state=8, mamba_dt_rank=4)),
    "nemotron_h": ("nemotron_h", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                                      num_hidden_layers=None, head_dim=16, n_groups=1, mamba_num_heads=4,
                                      mamba_head_dim=16, ssm_state_size=8, chunk_size=8, n_routed_experts=2,
                                      num_experts_per_tok=1, moe_intermediate_size=16,
                                      moe_shared_expert_intermediate_size=16,
                                      layers_block_type=["linear_attention", "full_attention", "mlp",
                                                         "full_attention", "moe"])),
    "recurrent_gemma": ("recurrent_gemma", dict(num_key_value_heads=2, head_dim=8, lru_width=32, num_hidden_layers=3,
                                                attention_window_size=5, conv1d_width=3, pad_token_id=0,
                                                block_types=["recurrent", "attention"])),
    # further encoders and decoders of covered layouts
    "bert-generation": ("bert-generation", dict(max_position_embeddings=64, intermediate_size=37, pad_token_id=0,
                                                bos_token_id=2, eos_token_id=1)),
    "ibert": ("ibert", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1)),
    "splinter": ("splinter", dict(max_position_embeddings=64, intermediate_size=37, question_token_id=5)),
    "roberta-prelayernorm": ("roberta-prelayernorm", dict(max_position_embeddings=66, intermediate_size=37,
                                                          pad_token_id=1)),
    "xlm-roberta-xl": ("xlm-roberta-xl", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1)),
    "eurobert": ("eurobert", dict(_KV2, mask_token_id=3, bos_token_id=1, eos_token_id=2)),
    "modernbert-decoder": ("modernbert-decoder", dict(max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                                      eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                                      sliding_window=12, layer_types=["sliding_attention",
                                                                                      "full_attention"])),
    # MoE and other cousins of covered rotary families (Llama's layout)
    "qwen2_moe": ("qwen2_moe", dict(_KV2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=16, rope_theta=100.0)),
    "phimoe": ("phimoe", dict(_KV2, num_local_experts=2, num_experts_per_tok=1, sliding_window=12)),
    "olmoe": ("olmoe", dict(_KV2, num_experts=2, num_experts_per_tok=1)),
    "granitemoe": ("granitemoe", dict(_KV2, num_local_experts=2, num_experts_per_tok=1, attention_multiplier=0.3,
                                      embedding_multiplier=2.5)),
    "granitemoeshared": ("granitemoeshared", dict(_KV2, num_local_experts=2, num_experts_per_tok=1,
                                                  attention_multiplier=0.3, embedding_multiplier=2.5,
                                                  shared_intermediate_size=16)),
    "glm4_moe": ("glm4_moe", dict(_KV2, head_dim=8, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                  first_k_dense_replace=1, n_group=1, topk_group=1, use_qk_norm=True,
                                  partial_rotary_factor=0.5, attention_bias=True)),
    "minimax_m2": ("minimax_m2", dict(_KV2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                                      partial_rotary_factor=0.5)),
    "ernie4_5": ("ernie4_5", dict(_KV2, use_bias=True)),
    "ernie4_5_moe": ("ernie4_5_moe", dict(_KV2, moe_num_experts=2, moe_k=1, moe_intermediate_size=16,
                                          moe_layer_start_index=1)),
    "helium": ("helium", dict(_KV2, head_dim=8)),
    "arcee": ("arcee", dict(_KV2)),
    "seed_oss": ("seed_oss", dict(_KV2, head_dim=8, attention_bias=True)),
    "internlm3": ("internlm3", dict(_KV2, head_dim=8, qkv_bias=True, bias=True)),
    "ministral3": ("ministral3", dict(_KV2, head_dim=8, sliding_window=12)),
    "cwm": ("cwm", dict(_KV2, head_dim=8, sliding_window=12, layer_types=["full_attention", "sliding_attention"])),
    "bitnet": ("bitnet", dict(_KV2)),
    "apertus": ("apertus", dict(_KV2, rope_parameters=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                          high_freq_factor=4.0, original_max_position_embeddings=16,
                                                          rope_theta=1000.0))),
    "flex_olmo": ("flex_olmo", dict(_KV2, num_experts=2, num_experts_per_tok=1)),
    "qwen3_next": ("qwen3_next", dict(_KV2, head_dim=16, num_hidden_layers=2, partial_rotary_factor=0.5,
                                      layer_types=["linear_attention", "full_attention"], num_experts=2,
                                      num_experts_per_tok=1, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=16, linear_num_value_heads=4,
                                      linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)),
    "qwen3_5_text": ("qwen3_5_text", dict(_KV2, head_dim=16, num_hidden_layers=2,
                                          layer_types=["linear_attention", "full_attention"],
                                          linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                                          linear_value_head_dim=8)),
    "qwen3_5_moe_text": ("qwen3_5_moe_text", dict(_KV2, head_dim=16, num_hidden_layers=2,
                                                  layer_types=["linear_attention", "full_attention"], num_experts=2,
                                                  num_experts_per_tok=1, moe_intermediate_size=16,
                                                  shared_expert_intermediate_size=16, linear_num_value_heads=4,
                                                  linear_num_key_heads=2, linear_key_head_dim=8,
                                                  linear_value_head_dim=8)),
    "granitemoehybrid": ("granitemoehybrid", dict(_GRANITE_HYBRID, position_embedding_type="rope")),
    "granitemoehybrid-nope": ("granitemoehybrid", dict(_GRANITE_HYBRID, position_embedding_type=None)),
    "minimax": ("minimax", dict(_KV2, head_dim=8, num_hidden_layers=2, layer_types=_LINEAR_FULL,
                                num_local_experts=2, num_experts_per_tok=1, partial_rotary_factor=0.5)),
    "olmo_hybrid": ("olmo_hybrid", dict(_KV2, num_hidden_layers=2, layer_types=_LINEAR_FULL,
                                        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                                        linear_value_head_dim=8)),
    # Llama 4: chunked rotary layers with a weightless qk norm, NoPE global layers with temperature tuning
    "llama4_text": ("llama4_text", dict(_KV2, head_dim=8, no_rope_layers=[1, 0], attention_chunk_size=12,
                                        layer_types=["chunked_attention", "full_attention"], use_qk_norm=True,
                                        attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5,
                                        num_local_experts=1, interleave_moe_layer_step=1,
                                        intermediate_size_mlp=48, rope_parameters=dict(rope_type="default",
                                                                                       rope_theta=1000.0))),
    "falcon_h1": ("falcon_h1", dict(_KV2, head_dim=8, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
                                    mamba_d_ssm=64, mamba_d_state=8, mamba_chunk_size=8, attention_bias=True,
                                    embedding_multiplier=2.5, attention_in_multiplier=0.7, key_multiplier=1.3)),
    "ministral": ("ministral", dict(_KV2, head_dim=8, sliding_window=12,
                                    layer_types=["sliding_attention", "full_attention"])),
    "glm4": ("glm4", dict(_KV2, head_dim=8, attention_bias=True, partial_rotary_factor=0.5)),
    "solar_open": ("solar_open", dict(_KV2, head_dim=8, n_routed_experts=2, num_experts_per_tok=1,
                                      moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1)),
    "glm4_moe_lite": ("glm4_moe_lite", dict(_MLA, q_lora_rank=12)),
    "youtu": ("youtu", dict(_MLA, q_lora_rank=12)),
    "mistral4": ("mistral4", dict(_MLA, q_lora_rank=12)),
    # issue 34, second round: dense and MoE variants of covered designs
    "vaultgemma": ("vaultgemma", dict(_KV2, head_dim=8, query_pre_attn_scalar=6, attn_logit_softcapping=3.0,
                                      sliding_window=12, layer_types=["sliding_attention", "full_attention"])),
    "dots1": ("dots1", dict(_KV2, head_dim=8, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                            first_k_dense_replace=1, n_shared_experts=1, sliding_window=12,
                            layer_types=["sliding_attention", "full_attention"])),
    "hyperclovax": ("hyperclovax", dict(_KV2, head_dim=8, attention_multiplier=0.3, embedding_multiplier=2.5,
                                        use_post_norm=True)),
    "jais2": ("jais2", dict(_KV2, head_dim=8, attention_bias=True, mlp_bias=True)),
    "iquestcoder": ("iquestcoder", dict(_KV2, head_dim=8)),
    "exaone": ("exaone", dict(_KV2, eos_token_id=2)),
    "nemotron": ("nemotron", dict(_KV2, head_dim=8, attention_bias=True,
                                  rope_parameters=dict(rope_type="default", rope_theta=1000.0,
                                                       partial_rotary_factor=0.5))),
    "sarvam_mla": ("sarvam_mla", dict(_MLA, q_lora_rank=12)),
    "lfm2_moe": ("lfm2_moe", dict(_KV2, num_hidden_layers=3, layer_types=["full_attention", "conv", "full_attention"],
                                  conv_L_cache=3, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                  num_dense_layers=1)),
    "aria_text": ("aria_text", dict(_KV2, head_dim=8, moe_num_experts=2, moe_topk=1, moe_num_shared_experts=1)),
    "apertus1p5_text": ("apertus1p5_text", dict(_KV2, head_dim=8)),
    "mellum": ("mellum", dict(_KV2, head_dim=8, sliding_window=12, num_local_experts=2, num_experts_per_tok=1,
                              moe_intermediate_size=16, layer_types=["sliding_attention", "full_attention"],
                              mlp_layer_types=["dense", "sparse"],
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                               "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 10000.0}})),
    "flint": ("flint", dict(_KV2, head_dim=8, sliding_window=12, num_experts=2, num_experts_per_tok=1,
                            moe_intermediate_size=16, shared_expert_intermediate_size=16, mlp_only_layers=[0],
                            layer_types=["sliding_attention", "full_attention"])),
    "kolibri1": ("kolibri1", dict(_KV2, head_dim=8, sliding_window=12, num_local_experts=2, num_experts_per_tok=1,
                                  moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                  layer_types=["sliding_attention", "full_attention"])),
    "afmoe": ("afmoe", dict(_KV2, head_dim=8, sliding_window=12, num_experts=2, num_experts_per_tok=1,
                            moe_intermediate_size=16, num_shared_experts=1, num_dense_layers=1, mup_enabled=True,
                            layer_types=["sliding_attention", "full_attention"])),
    "exaone_moe": ("exaone_moe", dict(_KV2, head_dim=8, sliding_window=12, num_experts=2, num_experts_per_tok=1,
                                      moe_intermediate_size=16, num_shared_experts=1, first_k_dense_replace=1,
                                      layer_types=["sliding_attention", "full_attention"],
                                      mlp_layer_types=["dense", "sparse"])),
    "hy_v3": ("hy_v3", dict(_KV2, head_dim=8, num_experts=2, num_experts_per_tok=1, num_shared_experts=1,
                            moe_intermediate_size=16, mlp_layer_types=["dense", "sparse"])),
    "esmc": ("esmc", dict(_KV2, num_key_value_heads=4, head_dim=8, mask_token_id=3)),
    "ultrabert": ("ultrabert", dict(_KV2, head_dim=8, sliding_window=5,
                                    layer_types=["sliding_attention", "full_attention"],
                                    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                                     "full_attention": {"rope_type": "default",
                                                                        "rope_theta": 10000.0}})),
    "axk1": ("axk1", dict(_MLA, q_lora_rank=12, mlp_layer_types=["dense", "sparse"])),
    "minicpm3": ("minicpm3", dict(_KV2, num_key_value_heads=4, kv_lora_rank=8, q_lora_rank=12, qk_rope_head_dim=4,
                                  qk_nope_head_dim=8, v_head_dim=8, scale_emb=3.0)),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", dict(_KV2, head_dim=8, attention_bias=True)),
    "hunyuan_v1_moe": ("hunyuan_v1_moe", dict(_KV2, head_dim=8, num_experts=2, moe_topk=1)),
    "dbrx": ("dbrx", dict(vocab_size=99, d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
                          attn_config=dict(kv_n_heads=2, clip_qkv=0.5, rope_theta=1000.0),
                          ffn_config=dict(ffn_hidden_size=16, moe_num_experts=2, moe_top_k=1)), dict(own=True)),
    "nanochat": ("nanochat", dict(_KV2, rms_norm_eps=1e-3)),
    # multi-head latent attention: a rotary part (4 dims) and a position-free part (8 dims) of each head
    "deepseek_v3": ("deepseek_v3", dict(_MLA, q_lora_rank=12, attention_bias=True,
                                        rope_parameters=dict(rope_type="yarn", factor=4.0, beta_fast=32.0,
                                                             beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                                             original_max_position_embeddings=16,
                                                             rope_theta=1000.0))),
    "deepseek_v3-rotate-half": ("deepseek_v3", dict(_MLA, q_lora_rank=None, rope_interleave=False)),
    "deepseek_v2": ("deepseek_v2", dict(_MLA, q_lora_rank=12, n_shared_experts=1)),
    "gptj": ("gptj", _GPTJ, dict(own=True)),
    "codegen": ("codegen", _GPTJ, dict(own=True)),
    "falcon": ("falcon", _FALCON, dict(own=True)),  # multi_query (one key head), rotary
    "falcon-new": ("falcon", dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2), dict(own=True)),
    "falcon-per-head": ("falcon", dict(_FALCON, multi_query=False, parallel_attn=False), dict(own=True)),
    "roformer": ("roformer", dict(max_position_embeddings=64, embedding_size=16)),
    "modernbert": ("modernbert", dict(max_position_embeddings=64, pad_token_id=0, local_attention=8,
                                      layer_types=["full_attention", "sliding_attention"], global_rope_theta=10000.0,
                                      local_rope_theta=100.0, attention_bias=True)),
    "esm-rotary": ("esm", dict(max_position_embeddings=66, pad_token_id=1, mask_token_id=3,
                               position_embedding_type="rotary", token_dropout=True)),
    # ALiBi (BLOOM and MPT add m_h * j, Falcon its bfloat16 rounding, scaled: equal up to a constant per row)
    "bloom": ("bloom", dict(vocab_size=99, hidden_size=32, n_layer=2, n_head=4), dict(own=True, compare="row")),
    "mpt": ("mpt", dict(vocab_size=99, d_model=32, n_layers=2, n_heads=4, max_seq_len=64, expansion_ratio=2),
            dict(own=True, compare="row")),
    # before transformers 5.25 its eager Falcon-ALiBi added the bias twice (in its scores and again in its mask);
    # sdpa, the default, once: posprobe reads the model as sdpa runs it
    "falcon-alibi": ("falcon", dict(_FALCON, alibi=True, multi_query=False),
                     dict(own=True, compare="row", attention="sdpa")),
    # learned absolute tables (faithful mode)
    "ernie": ("ernie", dict(max_position_embeddings=64, intermediate_size=37)),
    "tapas": ("tapas", dict(max_position_embeddings=64, intermediate_size=37, type_vocab_sizes=[3, 4, 5, 6, 7, 8, 9])),
    "git": ("git", dict(max_position_embeddings=64, intermediate_size=37, pad_token_id=0,
                        vision_config=dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=8, patch_size=4))),
    "luke": ("luke", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1, entity_vocab_size=10,
                          entity_emb_size=16)),
    "camembert": ("camembert", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1)),
    "data2vec-text": ("data2vec-text", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1)),
    "megatron-bert": ("megatron-bert", dict(max_position_embeddings=64, intermediate_size=37)),
    "rembert": ("rembert", dict(max_position_embeddings=64, intermediate_size=37, input_embedding_size=16)),
    "xmod": ("xmod", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1, languages=["en_XX"],
                          default_language="en_XX")),
    "xmod-pre-norm": ("xmod", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1,
                                   languages=["en_XX"], default_language="en_XX", pre_norm=True)),
    "layoutlm": ("layoutlm", dict(max_position_embeddings=64, intermediate_size=37, max_2d_position_embeddings=32)),
    "big_bird": ("big_bird", dict(max_position_embeddings=64, intermediate_size=37, rescale_embeddings=True,
                                  block_size=4, num_random_blocks=1)),
    "longformer": ("longformer", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1,
                                      attention_window=[8, 4])),
    "esm": ("esm", dict(max_position_embeddings=66, pad_token_id=1, mask_token_id=3, intermediate_size=37,
                        token_dropout=True, emb_layer_norm_before=True)),
    "mobilebert": ("mobilebert", dict(max_position_embeddings=64, intermediate_size=37, embedding_size=16,
                                      intra_bottleneck_size=16, num_feedforward_networks=1)),
    "mobilebert-shared-input": ("mobilebert", dict(max_position_embeddings=64, intermediate_size=37,
                                                   embedding_size=16, intra_bottleneck_size=16,
                                                   num_feedforward_networks=1, use_bottleneck_attention=True)),
    "squeezebert": ("squeezebert", dict(max_position_embeddings=64, intermediate_size=48, embedding_size=32,
                                        q_groups=2, k_groups=4, v_groups=1)),
    "gpt_neo": ("gpt_neo", dict(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4, window_size=5,
                                max_position_embeddings=64, attention_types=[[["local", "global"], 1]]),
                dict(own=True)),
    "opt": ("opt", dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37,
                        word_embed_proj_dim=16, max_position_embeddings=64, pad_token_id=1), dict(own=True)),
    "opt-post-ln": ("opt", dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37,
                                max_position_embeddings=64, pad_token_id=1, do_layer_norm_before=False),
                    dict(own=True)),
    "biogpt": ("biogpt", dict(max_position_embeddings=64, scale_embedding=True, pad_token_id=1)),
    "bart": ("bart", _SEQ2SEQ, dict(own=True)),
    "mbart": ("mbart", _SEQ2SEQ, dict(own=True)),
    "openai-gpt": ("openai-gpt", dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64),
                   dict(own=True)),
    "gpt_bigcode": ("gpt_bigcode", dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                        multi_query=True), dict(own=True)),
    "gpt_bigcode-per-head": ("gpt_bigcode", dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                 multi_query=False, scale_attn_weights=False), dict(own=True)),
    "plbart": ("plbart", _SEQ2SEQ, dict(own=True)),
    "mvp": ("mvp", _SEQ2SEQ, dict(own=True)),
    "blenderbot": ("blenderbot", _SEQ2SEQ, dict(own=True)),
    "blenderbot-small": ("blenderbot-small", _SEQ2SEQ, dict(own=True)),
    "deberta-v2-absolute": ("deberta-v2", _RELATIVE_OFF),
    "deberta-absolute": ("deberta", dict(_RELATIVE_OFF, pos_att_type=["c2p", "p2c", "p2p"])),
    # sinusoidal tables, built as the model builds them
    "marian": ("marian", _SEQ2SEQ, dict(own=True)),
    "pegasus": ("pegasus", _SEQ2SEQ, dict(own=True)),
    "m2m_100": ("m2m_100", _SEQ2SEQ, dict(own=True)),
    "xlm": ("xlm", dict(_XLM, n_langs=2), dict(own=True)),
    "flaubert": ("flaubert", _XLM, dict(own=True)),
    "ctrl": ("ctrl", dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, dff=37, n_positions=64), dict(own=True)),
    "xglm": ("xglm", dict(vocab_size=99, d_model=32, num_layers=2, attention_heads=4, ffn_dim=37,
                          max_position_embeddings=64, scale_embedding=True, pad_token_id=1), dict(own=True)),
    # issue 34 (fused): fused Q/K/V on disk, split on load (saved fused: save_pretrained inverts the conversion)
    "gte": ("gte", dict(max_position_embeddings=64, pad_token_id=1, type_vocab_size=1,
                        rope_parameters=dict(rope_type="default", rope_theta=100.0))),
    "nomic_bert": ("nomic_bert", dict(max_position_embeddings=64, pad_token_id=0,
                                      rope_parameters=dict(rope_type="default", rope_theta=100.0))),
    "jina_embeddings_v3": ("jina_embeddings_v3", dict(max_position_embeddings=64, pad_token_id=1,
                                                      rope_parameters=dict(rope_type="default", rope_theta=100.0))),
    "sarvam_moe": ("sarvam_moe", dict(_KV2, head_dim=8, n_routed_experts=2, num_experts_per_tok=1,
                                      moe_intermediate_size=16, first_k_dense_replace=1, attention_bias=True,
                                      rope_parameters=dict(rope_type="default", rope_theta=100.0,
                                                           partial_rotary_factor=0.5))),
    # RoCBert: [word; shape id 0; pronunciation id 0] through map_inputs_layer (pad 1: rows 0 are not padding)
    "roc_bert": ("roc_bert", dict(max_position_embeddings=64, intermediate_size=37, pad_token_id=1,
                                  shape_vocab_size=11, shape_embed_dim=8, pronunciation_vocab_size=13,
                                  pronunciation_embed_dim=12)),
    "roc_bert-no-shape": ("roc_bert", dict(max_position_embeddings=64, intermediate_size=37, pad_token_id=1,
                                           shape_vocab_size=11, shape_embed_dim=8, pronunciation_vocab_size=13,
                                           pronunciation_embed_dim=12, enable_shape=False)),
    "roc_bert-sum": ("roc_bert", dict(max_position_embeddings=64, intermediate_size=37, pad_token_id=1,
                                      shape_vocab_size=11, shape_embed_dim=8, pronunciation_vocab_size=13,
                                      pronunciation_embed_dim=12, concat_input=False)),
    # ConvBERT: 4 // head_ratio 2 = 2 softmax heads of 32 / 2 / 2 = 8 (beside 2 span-convolution heads)
    "convbert": ("convbert", dict(max_position_embeddings=64, intermediate_size=37, embedding_size=16, head_ratio=2,
                                  conv_kernel_size=3)),
    # CPM-Ant: segment-aware buckets (text: segment 2); token 0 is its padding, so the average word is token 5; no
    # prompt tokens here (the reference records (n, n) softmaxes; test_family_gaps checks a prompt of 3 tokens)
    "cpmant": ("cpmant", dict(vocab_size=99, hidden_size=32, num_attention_heads=4, dim_head=8, dim_ff=37,
                              num_hidden_layers=2, position_bias_num_buckets=12, position_bias_max_distance=20,
                              segment_types=3, prompt_types=2, prompt_length=0, eps=1e-3),
               dict(own=True, word_id=5)),
    # issue 34 (indexed): sparse indexed attention, an indexer's top-k keys per query (index_topk < the 16 positions
    # of the parity test, so the selection matters)
    "deepseek_v32": ("deepseek_v32", dict(_MLA, q_lora_rank=12, index_topk=5, index_n_heads=4, index_head_dim=8,
                                          rope_parameters=dict(rope_type="yarn", factor=4.0, beta_fast=32.0,
                                                               beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                                               original_max_position_embeddings=16,
                                                               rope_theta=1000.0))),
    "glm_moe_dsa": ("glm_moe_dsa", dict(_MLA, q_lora_rank=12, index_topk=4, index_n_heads=4, index_head_dim=8,
                                        num_hidden_layers=3, indexer_types=["full", "shared", "full"])),
    "axk2": ("axk2", dict(_MLA, q_lora_rank=12, index_topk=5, index_n_heads=4, index_head_dim=8, gated_norm_rank=6,
                          n_group=None, topk_group=None, mlp_layer_types=["dense", "sparse"])),
    # HY-V4: its initial hyper-connection stream weights sum to 1 + hc_mult * hc_eps; hc_eps 0.5 makes the mix count
    "hy_v4": ("hy_v4", dict(_MLA, q_lora_rank=12, index_topk=5, index_n_heads=4, index_head_dim=8, num_hidden_layers=3,
                            indexer_types=["full", "shared", "full"], hc_mult=3, hc_eps=0.5, learnable_sink_init=0.5)),
    # issue 34 (hybrid2)
    "zamba": ("zamba", dict(num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, num_hidden_layers=4,
                            layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], n_mamba_heads=2,
                            mamba_d_state=8, mamba_dt_rank=4)),
    "zamba2": ("zamba2", dict(num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0, num_hidden_layers=4,
                              layers_block_type=["mamba", "hybrid", "hybrid", "hybrid"], num_mem_blocks=2,
                              use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True,
                              rope_parameters={"rope_type": "default", "rope_theta": 100.0}, n_mamba_heads=4,
                              mamba_d_state=8, chunk_size=8)),
    "zamba2-nope": ("zamba2", dict(max_position_embeddings=64, pad_token_id=0, num_hidden_layers=2,
                                   layers_block_type=["mamba", "hybrid"], n_mamba_heads=4, mamba_d_state=8,
                                   chunk_size=8)),  # use_mem_rope off (the default): NoPE, no adapters
    "kimi_linear": ("kimi_linear", dict(_MLA, num_hidden_layers=2, layer_types=_LINEAR_FULL, q_lora_rank=12,
                                        attention_bias=True, mlp_layer_types=["dense", "dense"], linear_num_heads=4,
                                        linear_head_dim=8, linear_conv_kernel_dim=3)),
    "bailing_hybrid": ("bailing_hybrid", dict(_MLA, num_hidden_layers=2, layer_types=_LINEAR_FULL, q_lora_rank=12,
                                              head_dim=8, short_conv_kernel_size=3, mlp_layer_types=["dense", "dense"],
                                              rope_parameters=dict(rope_type="yarn", factor=4.0, mscale_all_dim=1.0,
                                                                   original_max_position_embeddings=16,
                                                                   rope_theta=1000.0))),
    "lara_mini": ("lara_mini", dict(_KV2, head_dim=8, num_hidden_layers=3, sliding_window=5,
                                    layer_types=["linear_attention", "sliding_attention", "full_attention"],
                                    rope_parameters={"rope_type": "default", "rope_theta": 100.0},
                                    linear_conv_kernel_dim=3, linear_key_head_dim=8, linear_value_head_dim=8,
                                    linear_num_key_heads=2, linear_num_value_heads=4, num_experts=2,
                                    num_experts_per_tok=1, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=16)),
    "lfm3": ("lfm3", dict(_KV2, head_dim=8, num_hidden_layers=3, sliding_window=5, conv_L_cache=3,
                          layer_types=["conv", "sliding_attention", "full_attention"],
                          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                           "full_attention": {"rope_type": "proportional", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 0.5}})),
    "inkling_text": ("inkling_text", dict(_KV2, head_dim=8, swa_num_attention_heads=4, swa_num_key_value_heads=4,
                                          swa_head_dim=8, sliding_window_size=5, d_rel=3, rel_extent=12,
                                          log_scaling_n_floor=2, layer_types=["hybrid_sliding", "hybrid"],
                                          mlp_layer_types=["dense", "dense"], conv_kernel_size=3)),
    # issue 34 (gemma4)
    "gemma3n_text": ("gemma3n_text", dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=8,
                                          max_position_embeddings=64, pad_token_id=0, sliding_window=5,
                                          layer_types=["sliding_attention", "full_attention"] * 2,
                                          rope_parameters=_GEMMA3_ROPE, num_kv_shared_layers=2, altup_num_inputs=3,
                                          altup_active_idx=1, laurel_rank=4, hidden_size_per_layer_input=8,
                                          vocab_size_per_layer_input=99), dict(boost=_ALTUP)),
    "gemma4_text": ("gemma4_text", dict(_GEMMA4, hidden_size_per_layer_input=8, vocab_size_per_layer_input=99)),
    "gemma4_unified_text": ("gemma4_unified_text", dict(_GEMMA4, attention_k_eq_v=False, num_kv_shared_layers=1)),
    # issue 34 (s2s)
    # Whisper's decoder: sizes of its own (3 encoder layers of 2 heads, 2 decoder layers of 4 heads); its words are
    # not scaled although scale_embedding is set (the encoder's setting)
    "whisper": ("whisper", dict(vocab_size=99, d_model=32, encoder_layers=3, decoder_layers=2,
                                encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=37,
                                decoder_ffn_dim=37, num_mel_bins=8, max_source_positions=16, max_target_positions=64,
                                pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=3,
                                scale_embedding=True), dict(own=True)),
    # TrOCR's decoder (TrOCRForCausalLM: no base model class): post-LN, a learned table offset by 2 behind an
    # embedding norm, or sinusoidal positions numbered from padding_idx + 1; scaled words
    "trocr": ("trocr", dict(vocab_size=99, d_model=32, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=37,
                            max_position_embeddings=64, pad_token_id=1, scale_embedding=True),
              dict(own=True, lm=True)),
    "trocr-sinusoidal": ("trocr", dict(vocab_size=99, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                                       decoder_ffn_dim=37, max_position_embeddings=64, pad_token_id=1,
                                       scale_embedding=True, use_learned_position_embeddings=False,
                                       layernorm_embedding=False), dict(own=True, lm=True)),
    # BigBird-Pegasus's encoder: pre-LN BigBird attention (full up to (5 + 2) x 4 = 28 tokens), scaled words
    "bigbird_pegasus": ("bigbird_pegasus", dict(_SEQ2SEQ, block_size=4, num_random_blocks=1, use_bias=True),
                        dict(own=True)),
    # ProphetNet's encoder: post-LN, a learned table numbered from padding_idx + 1 behind an embedding norm
    "prophetnet": ("prophetnet", dict(vocab_size=99, hidden_size=32, num_encoder_layers=3, num_decoder_layers=2,
                                      num_encoder_attention_heads=4, num_decoder_attention_heads=2,
                                      encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=66,
                                      pad_token_id=1, ngram=2, num_buckets=8, relative_max_distance=16),
                   dict(own=True)),
    # MusicGen's decoders (their causal LMs): three codebook tables summed, unscaled though scale_embedding is set
    "musicgen_decoder": ("musicgen_decoder", dict(_MUSICGEN), dict(own=True, cls="MusicgenForCausalLM")),
    "musicgen_melody_decoder": ("musicgen_melody_decoder", dict(_MUSICGEN),
                                dict(own=True, cls="MusicgenMelodyForCausalLM")),
    # Moshi's temporal transformer on text: Llama-like, Linear-wrapped projections, a vocab_size + 1 word table;
    # transformers does not apply its sliding_window (the mask test checks it)
    "moshi": ("moshi", dict(_KV2, head_dim=8, ffn_dim=48, rms_norm_eps=1e-5, sliding_window=5)),
    # issue 34 (attnvar)
    # Granite SWA: a rope base per layer (0: NoPE), sliding and global layers, learned sinks
    "granite_swa": ("granite_swa", dict(_KV2, bos_token_id=1, eos_token_id=2, num_hidden_layers=3,
                                        attention_multiplier=0.3, embedding_multiplier=2.5, sliding_window=6,
                                        layer_rope_theta=[100.0, 0, 10000.0],
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "granitemoe_swa": ("granitemoe_swa", dict(_KV2, bos_token_id=1, eos_token_id=2, num_hidden_layers=3,
                                              attention_multiplier=0.3, embedding_multiplier=2.5, num_local_experts=2,
                                              num_experts_per_tok=1, sliding_window=6,
                                              layer_rope_theta=[10000.0, 100.0, 0],
                                              layer_types=["full_attention", "sliding_attention",
                                                           "full_attention"])),
    # MiMo-V2-Flash: sliding layers with twice the key heads and learned sinks, a rope setting per layer type
    "mimo_v2_flash": ("mimo_v2_flash", dict(_KV2, head_dim=8, v_head_dim=6, sliding_window=6, n_routed_experts=2,
                                            num_experts_per_tok=1, moe_intermediate_size=16,
                                            layer_types=["full_attention", "sliding_attention"],
                                            mlp_layer_types=["dense", "sparse"],
                                            rope_parameters={"full_attention": {"rope_type": "default",
                                                                                "rope_theta": 10000.0,
                                                                                "partial_rotary_factor": 0.5},
                                                             "sliding_attention": {"rope_type": "default",
                                                                                   "rope_theta": 100.0,
                                                                                   "partial_rotary_factor": 1.0}})),
    # DiffLlama: two softmax heads per differential head (F̂ of each softmax head)
    "diffllama": ("diffllama", dict(_KV2, head_dim=8, rope_theta=100.0)),
    # Doge: a learned bias from each key's value in every score (its dynamic mask), q/k norms
    "doge": ("doge", dict(_KV2, max_position_embeddings=64, keep_window_size=64, attention_bias=True)),
    # Dory (nGPT): unit-norm q/k, the rotated query rescaled per channel; input, recurrent (one loop), output layers
    "dory": ("dory", dict(_KV2, head_dim=8, num_hidden_layers=3, n_input_layers=1, n_output_layers=1,
                          n_recurrent_loops=1, sliding_window=6, initializer_range=0.02,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                           "full_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    # Cohere Compass: M-RoPE of text positions in sliding layers, NoPE global layers (no rope parameters)
    "cohere_compass_text": ("cohere_compass_text", dict(_KV2, head_dim=8, num_hidden_layers=3, sliding_window=6,
                                                        layer_types=["sliding_attention", "full_attention",
                                                                     "sliding_attention"],
                                                        rope_parameters={"sliding_attention": {
                                                            "rope_type": "default", "rope_theta": 100.0,
                                                            "mrope_section": [2, 1, 1]}, "full_attention": None})),
    # Beam: rotary sliding layers, NoPE global layers whose query grows with position, q/k norms
    "beam": ("beam", dict(_KV2, head_dim=8, sliding_window=6, num_experts=2, num_experts_per_tok=1,
                          moe_intermediate_size=16, n_group=1, topk_group=1,
                          layer_types=["sliding_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
                          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                           "full_attention": None})),
    # JetMoE: 3 query experts, 2 picked per token (4 heads over 2 shared key heads); norms with a fixed epsilon
    "jetmoe": ("jetmoe", dict(num_key_value_heads=2, kv_channels=8, num_local_experts=3, num_experts_per_tok=2,
                              max_position_embeddings=64, rms_norm_eps=1e-3, rope_theta=100.0)),
    # issue 34 (mm): multimodal wrappers, read as their language model (text_config); each vision tower has one
    # layer whose attention tensors end in the same suffixes as the language model's, at names of the same length
    "gemma3": ("gemma3", dict(text_config=dict(SMALL, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                                               pad_token_id=0, query_pre_attn_scalar=6, sliding_window=5,
                                               rope_parameters=_GEMMA3_ROPE,
                                               layer_types=["sliding_attention", "full_attention"]),
                              vision_config=_VISION, mm_tokens_per_image=4), dict(own=True)),
    "qwen3_5": ("qwen3_5", dict(text_config=dict(_QWEN3_5_TEXT, rope_parameters=_MROPE),
                                vision_config=_QWEN_VISION), dict(own=True)),
    "qwen3_5_moe": ("qwen3_5_moe", dict(text_config=dict(_QWEN3_5_TEXT, num_experts=2, num_experts_per_tok=1,
                                                         moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                                         rope_parameters=_MROPE),
                                        vision_config=_QWEN_VISION), dict(own=True)),
    "got_ocr2": ("got_ocr2", dict(text_config=dict(SMALL, num_key_value_heads=2, max_position_embeddings=64,
                                                   pad_token_id=0, rope_theta=100.0),
                                  vision_config=dict(hidden_size=32, output_channels=32, num_hidden_layers=1,
                                                     num_attention_heads=4, image_size=16, patch_size=8, mlp_dim=48,
                                                     window_size=2, global_attn_indexes=[0])), dict(own=True)),
    "fuyu": ("fuyu", dict(text_config=dict(SMALL, max_position_embeddings=64, qk_layernorm=True,
                                           partial_rotary_factor=0.5), image_size=16, patch_size=8), dict(own=True)),
    "modernvbert": ("modernvbert", dict(text_config=dict(SMALL, max_position_embeddings=64, pad_token_id=0,
                                                         bos_token_id=1, eos_token_id=2, sep_token_id=3,
                                                         cls_token_id=4, local_attention=8,
                                                         layer_types=["full_attention", "sliding_attention"],
                                                         global_rope_theta=10000.0, local_rope_theta=100.0,
                                                         attention_bias=True),
                                        vision_config=_VISION), dict(own=True)),
    "ultravbert": ("ultravbert", dict(text_config=dict(SMALL, num_key_value_heads=2, max_position_embeddings=64,
                                                       pad_token_id=0, head_dim=8, sliding_window=5,
                                                       layer_types=["sliding_attention", "full_attention"],
                                                       rope_parameters=_ULTRABERT_ROPE),
                                      vision_config=_VISION), dict(own=True)),
    "moss_transcribe_diarize": ("moss_transcribe_diarize", dict(
        text_config=dict(SMALL, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0),
        audio_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                          num_mel_bins=8, max_source_positions=16)), dict(own=True)),
    "gemma4": ("gemma4", dict(text_config={**SMALL, **_GEMMA4, "hidden_size_per_layer_input": 8,
                                           "vocab_size_per_layer_input": 99}), dict(own=True)),
    "gemma4_unified": ("gemma4_unified", dict(text_config={**SMALL, **_GEMMA4, "attention_k_eq_v": False,
                                                           "num_kv_shared_layers": 1}), dict(own=True)),
    "emu3": ("emu3", dict(text_config=dict(SMALL, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2, attention_bias=True,
                                           rope_parameters=dict(rope_type="default", rope_theta=500.0)),
                          vq_config=dict(codebook_size=16, embed_dim=4, base_channels=32, channel_multiplier=[1],
                                         num_res_blocks=1, attn_resolutions=[], hidden_size=8, num_attention_heads=1),
                          vocabulary_map={"<|visual token 000000|>": 90}), dict(own=True)),
    "phi4_multimodal": ("phi4_multimodal", dict(num_key_value_heads=2, max_position_embeddings=64,
                                                original_max_position_embeddings=16, pad_token_id=0, bos_token_id=1,
                                                eos_token_id=2, sliding_window=6,
                                                rope_parameters=dict(rope_type="longrope", rope_theta=1000.0,
                                                                     partial_rotary_factor=0.5,
                                                                     short_factor=[1.0, 1.5],
                                                                     long_factor=[1.0, 3.0]),
                                                vision_config=dict(_VISION, crop_size=16),
                                                audio_config=dict(hidden_size=32, intermediate_size=48, num_blocks=1,
                                                                  num_attention_heads=4, ext_pw_out_channel=32,
                                                                  depthwise_separable_out_channel=32,
                                                                  nemo_conv_channels=32, input_size=8))),
    # Mllama: layer 1 cross-attends to the image (skipped on text alone): no positional score
    "mllama": ("mllama", dict(text_config=dict(SMALL, num_hidden_layers=3, num_key_value_heads=2,
                                               max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2, cross_attention_layers=[1],
                                               rope_parameters=dict(rope_type="llama3", rope_theta=500.0, factor=8.0,
                                                                    low_freq_factor=1.0, high_freq_factor=4.0,
                                                                    original_max_position_embeddings=16)),
                              vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                 num_global_layers=1, attention_heads=4, vision_output_dim=64,
                                                 image_size=16, patch_size=8, max_num_tiles=1,
                                                 intermediate_layers_indices=[0],
                                                 supported_aspect_ratios=[[1, 1]])), dict(own=True)),
    # issue 34 (odd)
    "xlnet": ("xlnet", dict(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37, clamp_len=5), dict(own=True)),
    "funnel": ("funnel", dict(_FUNNEL, block_sizes=[3, 1]), dict(own=True)),
    "funnel-factorized": ("funnel", dict(_FUNNEL, block_sizes=[2, 2], attention_type="factorized",
                                         separate_cls=False), dict(own=True)),
    "longcat_flash": ("longcat_flash", dict(vocab_size=99, hidden_size=32, num_layers=2, num_attention_heads=4,
                                            num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=8, head_dim=4,
                                            qk_rope_head_dim=4, qk_nope_head_dim=8, qk_head_dim=12, v_head_dim=8,
                                            ffn_hidden_size=48, expert_ffn_hidden_size=16, n_routed_experts=2,
                                            zero_expert_num=1, moe_topk=2, max_position_embeddings=64,
                                            attention_bias=True,
                                            rope_parameters=dict(rope_type="default", rope_theta=100.0)),
                      dict(own=True)),
    "neomme": ("neomme", dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=8, embedding_rank=16,
                              max_position_embeddings=64, attention_bias=True, sliding_window=3,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              per_layer_config={0: {"sliding_window": 3}, 1: {"sliding_window": None},
                                                2: {"sliding_window": 5}},
                              rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=100.0),
                                               "full_attention": dict(rope_type="default", rope_theta=1000.0,
                                                                      partial_rotary_factor=0.5)})),
    "zaya": ("zaya", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attention_bias=True,
                          bos_token_id=1, eos_token_id=2,
                          cca_time0=2, cca_time1=3, sliding_window=5, layer_types=["hybrid_sliding", "hybrid"],
                          num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, router_hidden_size=8,
                          rope_parameters={"hybrid_sliding": dict(rope_type="default", rope_theta=100.0),
                                           "hybrid": dict(rope_type="default", rope_theta=1000.0,
                                                          partial_rotary_factor=0.5)})),
    "hrm_text": ("hrm_text", dict(num_hidden_layers=2, H_cycles=2, L_cycles=2, L_bp_cycles=[1], head_dim=8,
                                  embedding_scale=3.0, max_position_embeddings=64, attention_bias=True,
                                  rope_parameters=dict(rope_type="default", rope_theta=100.0))),
    # issue 34 (groups): a block indexer per key-head group, 3 of 6 blocks of 3 keys kept (1 local; the last block
    # short) at the 16 positions of the parity test; the indexer rotates the first 4 of its 8 dims (partial rotary)
    "minimax_m3_vl_text": ("minimax_m3_vl_text", dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=8,
                                                      rope_parameters=dict(rope_type="default", rope_theta=100.0,
                                                                           partial_rotary_factor=0.5),
                                                      index_n_heads=2, index_head_dim=8, index_block_size=3,
                                                      index_topk_blocks=3, index_local_blocks=1,
                                                      layer_types=["full_attention", "minimax_m3_sparse",
                                                                   "minimax_m3_sparse"],
                                                      mlp_layer_types=["dense"] * 3, dense_intermediate_size=48,
                                                      bos_token_id=1, eos_token_id=2)),
    # issue 34 (heads)
    # Laguna: 2 query heads in layers 0 and 2, 4 in layers 1 and 3 (2 key heads); sliding layers with a window of 5
    # and full base-100 rope, global layers with a partial (half) rope at base 1000
    "laguna": ("laguna", dict(num_hidden_layers=4, num_attention_heads_per_layer=[2, 4, 2, 4], num_key_value_heads=2,
                              head_dim=8, max_position_embeddings=64, pad_token_id=0, sliding_window=5,
                              layer_types=["sliding_attention", "full_attention"] * 2,
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                               "full_attention": {"rope_type": "default", "rope_theta": 1000.0,
                                                                  "partial_rotary_factor": 0.5}},
                              num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16)),
    # issue 34 (wrap)
    # Gemma 3n as transformers saves it (Gemma3nForConditionalGeneration: model.language_model.*, an audio tower, the
    # vision and audio soft-token embedders), its timm vision tower left out (built only with timm; never run on
    # text); text ids < 99 (the vision and audio soft tokens from 99 on)
    "gemma3n": ("gemma3n", dict(text_config=dict(SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=8,
                                                 max_position_embeddings=64, pad_token_id=0, sliding_window=5,
                                                 layer_types=["sliding_attention", "full_attention"] * 2,
                                                 rope_parameters=_GEMMA3_ROPE, num_kv_shared_layers=2,
                                                 altup_num_inputs=3, altup_active_idx=1, laurel_rank=4,
                                                 hidden_size_per_layer_input=8, vocab_size_per_layer_input=99),
                                vision_config=dict(hidden_size=32, vocab_offset=99, label_names=["none"]),
                                audio_config=dict(hidden_size=32, vocab_offset=99 + 128, input_feat_size=8,
                                                  conf_num_hidden_layers=1, conf_num_attention_heads=4,
                                                  sscp_conv_channel_size=[8, 8])),
                dict(own=True, cls="Gemma3nForConditionalGeneration", left_out=("gemma3n_vision",), boost=_ALTUP)),
    # Llama 4 (Llama4ForConditionalGeneration: language_model.model.*, language_model.lm_head, a vision model and
    # its projector), its language model the llama4_text case's
    "llama4": ("llama4", dict(text_config=dict(SMALL, **_KV2, head_dim=8, no_rope_layers=[1, 0],
                                               attention_chunk_size=12, use_qk_norm=True,
                                               layer_types=["chunked_attention", "full_attention"],
                                               attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5,
                                               num_local_experts=1, interleave_moe_layer_step=1,
                                               intermediate_size_mlp=48,
                                               rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
                              vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                 num_attention_heads=4, image_size=16, patch_size=8,
                                                 vision_output_dim=32, projector_input_dim=32,
                                                 projector_output_dim=32, intermediate_layers_indices=[0])),
               dict(own=True)),
    # issue 34 (dots3): the sizes per layer type in _DOTS3; the wrapper's towers as small as they build
    "dots3_note_text": ("dots3_note_text", dict(_DOTS3)),
    # the released checkpoint's sliding layers have half the heads of its indexed layers: here 2 of 4
    "dots3_note_text-heads": ("dots3_note_text", dict(_MLA, num_hidden_layers=2, q_lora_rank=12, head_dim=12,
                                                      index_topk=5, index_n_heads=4, index_head_dim=8,
                                                      sliding_window=3,
                                                      layer_types=["sliding_attention", "indexed_attention"],
                                                      swa_num_attention_heads=2, swa_num_key_value_heads=2,
                                                      swa_q_lora_rank=16, swa_kv_lora_rank=8, swa_head_dim=14,
                                                      swa_qk_nope_head_dim=8, swa_v_head_dim=8,
                                                      shared_experts_intermediate_size=16)),
    # a window of 4: the wrappers' data-conditioned texts (7 and 4 tokens) leave no padding row without a real key,
    # which float64 eager Dots3 turns into NaN (see IN_FLOAT32 in tests/test_capture_families.py)
    "dots3_note": ("dots3_note", dict(text_config={**SMALL, **_DOTS3, "sliding_window": 4},
                                      vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                         num_attention_heads=4, patch_size=4, mlp_layer_types=["dense"],
                                                         adapter_in_dim=32, adapter_out_dim=32),
                                      audio_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                        num_attention_heads=4, feature_size=8, downsample_hidden_size=8,
                                                        adapter_input_size=32, adapter_out_dim=32,
                                                        max_position_embeddings=64)), dict(own=True)),
    # issue 34 (qwen4)
    # Qwen4-Exp: 3 hyper-connection streams; indexed layers 1 and 3 (a block indexer: 2 of the complete blocks of 3
    # mean-pooled keys per query, plus its partial block; it rotates all 8 of its dims, the attention the first 8 of
    # 16); gated DeltaNet layers 0 and 2, layer 0 with hashed n-gram embeddings (PLE)
    "qwen4_exp_text": ("qwen4_exp_text", dict(_QWEN4_EXP_TEXT, rope_parameters=_QWEN4_EXP_ROPE)),
    "qwen4_exp": ("qwen4_exp", dict(text_config=dict(SMALL, **_QWEN4_EXP_TEXT, rope_parameters=_QWEN4_EXP_ROPE),
                                    vision_config=_QWEN_VISION), dict(own=True)),
    # issue 34 (dsv4)
    # DeepSeek V4: every layer a window of 6 raw keys, learned sinks (boosted: not 0), one shared key-value head, a
    # query LoRA; rope on the last 4 of 8 dims per head, base 100 in the sliding layer ('main') and 1000 in the
    # compressed ones ('compress'); CSA pools blocks of 4 (its indexer keeps 2), HCA blocks of 8, so the 16 positions
    # of the parity test get pooled entries; hc_eps 0.5 makes the hyper-connection mix count
    "deepseek_v4": ("deepseek_v4", dict(num_hidden_layers=3, num_key_value_heads=1, head_dim=8, q_lora_rank=12,
                                        layer_types=["sliding_attention", "compressed_sparse_attention",
                                                     "heavily_compressed_attention"],
                                        compress_rates={"compressed_sparse_attention": 4,
                                                        "heavily_compressed_attention": 8},
                                        sliding_window=6, partial_rotary_factor=0.5, rope_theta=100.0,
                                        compress_rope_theta=1000.0, hc_mult=2, hc_eps=0.5, o_groups=2, o_lora_rank=8,
                                        n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                        index_n_heads=2, index_head_dim=8, index_topk=2, max_position_embeddings=64,
                                        pad_token_id=0),
                    dict(boost=("self_attn.sinks",))),
    # issue 34 (reformer)
    # Reformer's LM (is_decoder: causal): local layers in chunks of 4 that see their chunk, the one before and the one
    # after (causality hides it, except where the chunks wrap around: the last chunk's next is the first, whose keys
    # come before it), an LSH layer between (no positional score), axial positions 4 x 8 (widths 12 + 20); a fixed
    # hash seed makes its LSH layer repeatable
    "reformer": ("reformer", dict(_REFORMER, is_decoder=True, attn_layers=["local", "lsh", "local"]),
                 dict(own=True, boost=_REFORMER_QK)),
    # its masked LM (bidirectional): the chunk after too, the chunks wrapping around (chunk 0 sees the last one), a
    # plain learned table (axial_pos_embds off)
    "reformer-masked": ("reformer", dict(_REFORMER, is_decoder=False, attn_layers=["lsh", "local"],
                                         axial_pos_embds=False), dict(own=True, boost=_REFORMER_QK)),
    # issue 34 (blt)
    # BLT: a byte encoder (2 layers, rope base 100) and a byte decoder (3 layers, base 1000) of 2 key heads, causal
    # byte window 5, around a global transformer over patches (1 layer: no positional score); two hashed n-gram tables
    # of 11 rows; no entropy model (one patch per byte)
    "blt": ("blt", dict(vocab_size=99, patch_in_forward=False, local_attention_window_len=5,
                        encoder_hash_byte_group_size=[2, 3], encoder_hash_byte_group_vocab=11,
                        encoder_config=dict(_BLT_BYTES, rope_parameters=dict(rope_type="default", rope_theta=100.0)),
                        decoder_config=dict(_BLT_BYTES, num_hidden_layers=3,
                                            rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
                        global_config=dict(SMALL, hidden_size=48, num_hidden_layers=1), patcher_config=SMALL),
            dict(own=True)),
    # issue 34 (inkling2)
    # Inkling 2: blocks of 2 layers (layer 2 mixes its input over block 0 and its own; layer 3 over blocks 0, 1);
    # sliding layers with a window of 5, log-scaled full layers from position 2 with input-conditioned key taps;
    # projections, taps and sinks drawn at unit scale, L2 clips (q/k 10, relative states 7) that bind some heads and
    # not others; a large norm epsilon, so that the depth mix's unweighted norm of the input shows in the scores
    "inkling2_text": ("inkling2_text", dict(_KV2, num_hidden_layers=4, head_dim=8, swa_num_attention_heads=4,
                                            swa_num_key_value_heads=2, swa_head_dim=8, sliding_window_size=5, d_rel=3,
                                            rel_extent=12, log_scaling_n_floor=2, conv_kernel_size=3,
                                            layer_types=["hybrid_sliding", "hybrid"] * 2,
                                            n_layers_per_attn_res_block=2, n_routed_experts=2, num_experts_per_tok=1,
                                            moe_intermediate_size=16, unpadded_vocab_size=99, bos_token_id=1,
                                            eos_token_id=2, rms_norm_eps=0.3, qk_l2_clip_threshold=10.0,
                                            rel_l2_clip_threshold=7.0),
                      dict(boost=("embed_tokens.weight", "q_proj.linear", "k_proj.linear", "sconv.static_weight",
                                  "sconv.weight_proj", "attention_input.query", "relative_position_bias.linear",
                                  "sink_proj"))),
    # Inkling 2 Loop: layers 2 and 3 run twice (depths 2, 3, then 4, 5 with message gates of rank 4, their down
    # projections drawn at unit scale), then layers 4 and 5 (depths 6, 7); clips at 3 soften the softmax, so that
    # float32 batches of texts stay within the capture test's tolerance through the 8 depths
    "inkling2_loop_text": ("inkling2_loop_text", dict(_KV2, num_hidden_layers=6, head_dim=8, swa_num_attention_heads=4,
                                                      swa_num_key_value_heads=2, swa_head_dim=8, sliding_window_size=5,
                                                      d_rel=3, rel_extent=12, log_scaling_n_floor=2,
                                                      conv_kernel_size=3, layer_types=["hybrid_sliding", "hybrid"] * 3,
                                                      n_layers_per_attn_res_block=2, n_routed_experts=2,
                                                      num_experts_per_tok=1, moe_intermediate_size=16,
                                                      unpadded_vocab_size=99, bos_token_id=1, eos_token_id=2,
                                                      rms_norm_eps=0.3, qk_l2_clip_threshold=3.0,
                                                      rel_l2_clip_threshold=3.0, loop_layer_index_start=2,
                                                      loop_layer_index_end=4, loop_num_passes=2, loop_gate_rank=4),
                           dict(boost=("embed_tokens.weight", "q_proj.linear", "k_proj.linear", "sconv.static_weight",
                                       "sconv.weight_proj", "attention_input.query", "relative_position_bias.linear",
                                       "sink_proj", "message_gate.down_proj", "message_input.query"))),
    # issue 34 (stacks)
    # BigBird-Pegasus's decoder (--stack decoder): full causal self-attention (never block-sparse) over its own
    # learned table, with sizes of its own (3 layers of 2 heads beside the encoder's 2 of 4)
    "bigbird_pegasus-decoder": ("bigbird_pegasus", dict(_SEQ2SEQ, block_size=4, num_random_blocks=1, use_bias=True,
                                                        decoder_layers=3, decoder_attention_heads=2),
                                dict(own=True, stack="decoder")),
    # ProphetNet's decoder main stream (--stack decoder): causal, its own table numbered from padding_idx + 1 behind
    # its own embedding norm, plus a bias per bucket (8 buckets, exact up to 4) from each query's input; 2 layers of
    # 2 heads beside the encoder's 3 of 4; the relative projection boosted so that its bias outweighs rounding
    "prophetnet-decoder": ("prophetnet", dict(vocab_size=99, hidden_size=32, num_encoder_layers=3,
                                              num_decoder_layers=2, num_encoder_attention_heads=4,
                                              num_decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37,
                                              max_position_embeddings=66, pad_token_id=1, ngram=2, num_buckets=8,
                                              relative_max_distance=16),
                           dict(own=True, stack="decoder", boost=("relative_pos_embeddings",))),
    # issue 44: transformers 5.25's new types
    # Param2-MoE: transformers' GLM-4-MoE classes, its own config (rotary over whole heads, not GLM-4-MoE's half)
    "param2moe": ("param2moe", dict(_KV2, head_dim=8, n_routed_experts=2, num_experts_per_tok=1,
                                    moe_intermediate_size=16, first_k_dense_replace=1, n_shared_experts=1,
                                    attention_bias=True, rope_parameters=dict(rope_type="default",
                                                                              rope_theta=100.0))),
    # MiniCPM5-MoE: the query Linear's rows per head [q_h; gate_h] (a sigmoid output gate)
    "minicpm5_moe": ("minicpm5_moe", dict(_KV2, head_dim=8, n_routed_experts=2, num_experts_per_tok=1,
                                          moe_intermediate_size=16, first_k_dense_replace=1,
                                          rope_parameters=dict(rope_type="default", rope_theta=100.0))),
    # Ergo: sliding layers (a window of 5, interleaved rope at base 100) and NoPE global layers whose logits are
    # scaled by global_attention_scale; one fused [q; k; v] Linear, q/k norms, gated residuals (drawn off 0)
    "ergo": ("ergo", dict(_KV2, num_hidden_layers=4, global_attention_every_n_layers=2, sliding_window=5,
                          global_attention_scale=1.7, first_dense_intermediate_size=48, num_dense_blocks=1,
                          moe_intermediate_size=16, shared_intermediate_size=16, num_experts=2, num_experts_per_tok=1,
                          rope_parameters=dict(rope_type="default", rope_theta=100.0)),
             dict(boost=("residual_gate",))),
    # Kolibri 1.1: a rotary sliding layer (a window of 5), then NoPE indexed layers (1 and 3 pick pools, 2 and 4 reuse
    # them; 3 reads the keys and values of 2, 4 those of 1, not of the last layer that stores some); beyond 8 visible
    # keys a query keeps 1 sink, the last 3 and 4 more: from a pool of the first 8 keys where it sees more than 8 (the
    # top-k binds), or of the first 4 ("-pool": the pool binds)
    "kolibri1_1": ("kolibri1_1", dict(_KOLIBRI1_1, index_pool_size=8)),
    "kolibri1_1-pool": ("kolibri1_1", dict(_KOLIBRI1_1, index_pool_size=4)),
}  # fmt: skip
# MoE families built with transformers' eager experts (its grouped kernels take no float64)
_EAGER_EXPERTS = ("mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "deepseek_v2", "qwen2_moe", "phimoe", "olmoe",
                  "granitemoe", "granitemoeshared", "glm4_moe", "minimax_m2", "ernie4_5_moe", "flex_olmo",
                  "solar_open", "glm4_moe_lite", "youtu", "mistral4", "dots1", "sarvam_mla",
                  "lfm2_moe", "aria_text", "mellum", "flint", "kolibri1", "afmoe",
                  "exaone_moe", "hy_v3", "axk1", "hunyuan_v1_moe", "cohere2_moe", "nemotron_h",
                  "sarvam_moe", "deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4", "granitemoe_swa", "mimo_v2_flash",
                  "beam", "zaya")  # fmt: skip
# XGLM's eager attention clamps with a float32 constant; the MoE layers of Qwen3-Next, Granite-MoE-hybrid and
# MiniMax use grouped matmuls that take no float64: they cannot run in float64
FLOAT32 = {"xglm", "qwen3_next", "granitemoehybrid", "granitemoehybrid-nope", "minimax", "qwen3_5_moe_text",
           "qwen3_5_moe"}  # fmt: skip
FLOAT32 |= {"inkling2_text", "inkling2_loop_text"}  # issue 34 (inkling2): a float32 router weight
FLOAT32 |= {"longcat_flash"}  # transformers 5.25: its experts run a grouped matmul that refuses float64


# Cases added for issue 34 (the newest position designs and the further families). Tests over every case keep them
# in the slow tier (CI runs it), except one per design in DESIGNS_QUICK, to hold the default tier's time.
ISSUE_34_CASES = frozenset({
    "apertus", "arcee", "bamba", "bert-generation", "bitnet", "cohere2", "cwm", "deepseek_v2", "deepseek_v3",
    "deepseek_v3-rotate-half", "ernie4_5", "ernie4_5_moe", "eurobert", "exaone4", "exaone4-no-window", "falcon_h1",
    "flex_olmo", "glm4_moe", "gpt_oss", "granitemoe", "granitemoehybrid", "granitemoehybrid-nope", "granitemoeshared",
    "helium", "ibert", "internlm3", "jamba", "lfm2", "llama4_text", "minimax", "minimax_m2", "ministral3",
    "modernbert-decoder", "olmo3", "olmo_hybrid", "olmoe", "phimoe", "qwen2_moe", "qwen3_next",
    "roberta-prelayernorm", "seed_oss", "smollm3", "smollm3-sliding", "splinter", "xlm-roberta-xl", "ministral",
    "glm4", "solar_open", "glm4_moe_lite", "youtu", "mistral4", "vaultgemma", "dots1", "hyperclovax", "jais2",
    "iquestcoder", "exaone", "nemotron", "sarvam_mla", "lfm2_moe", "aria_text", "apertus1p5_text", "mellum", "flint",
    "kolibri1", "afmoe", "exaone_moe", "hy_v3", "esmc", "ultrabert", "axk1", "minicpm3", "plbart", "mvp",
    "blenderbot", "blenderbot-small", "openai-gpt", "gpt_bigcode", "gpt_bigcode-per-head",
    "hunyuan_v1_dense", "hunyuan_v1_moe", "dbrx", "cohere2_moe", "cohere2_moe-rms-dense-prefix",
    "qwen3_5_text", "qwen3_5_moe_text", "nanochat", "nemotron_h", "recurrent_gemma", "ctrl", "xlm", "flaubert",
    "gpt_neox_japanese", "luke", "tapas", "git",
    "gte", "nomic_bert", "jina_embeddings_v3", "sarvam_moe", "roc_bert", "roc_bert-no-shape", "roc_bert-sum",
    "convbert", "cpmant",
    "granite_swa", "granitemoe_swa", "jetmoe", "mimo_v2_flash", "diffllama", "doge", "dory", "cohere_compass_text",
    "beam",
    "xlnet", "funnel", "funnel-factorized", "longcat_flash", "neomme", "zaya", "hrm_text",  # issue 34 (odd)
})  # fmt: skip
ISSUE_34_CASES |= {"deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4"}  # issue 34 (indexed)
ISSUE_34_CASES |= {"zamba", "zamba2", "zamba2-nope", "kimi_linear", "bailing_hybrid", "lara_mini", "lfm3",
                   "inkling_text"}  # fmt: skip
_EAGER_EXPERTS += ("lara_mini",)  # issue 34 (hybrid2)
_EAGER_EXPERTS += ("laguna",)  # issue 34 (heads)
ISSUE_34_CASES |= {"gemma3n_text", "gemma4_text", "gemma4_unified_text"}  # issue 34 (gemma4)
ISSUE_34_CASES |= {"minimax_m3_vl_text"}  # issue 34 (groups)
ISSUE_34_CASES |= {"gemma3", "qwen3_5", "qwen3_5_moe", "got_ocr2", "fuyu", "modernvbert", "ultravbert",
                   "moss_transcribe_diarize", "emu3", "phi4_multimodal", "mllama", "gemma4",
                   "gemma4_unified"}  # issue 34 (mm)  # fmt: skip
ISSUE_34_CASES |= {"laguna"}  # issue 34 (heads)
_EAGER_EXPERTS += ("dots3_note_text", "dots3_note")  # issue 34 (dots3)
ISSUE_34_CASES |= {"dots3_note_text", "dots3_note_text-heads", "dots3_note"}  # issue 34 (dots3)
ISSUE_34_CASES |= {"gemma3n", "llama4"}  # issue 34 (wrap)
ISSUE_34_CASES |= {"qwen4_exp_text", "qwen4_exp"}  # issue 34 (qwen4)
_EAGER_EXPERTS += ("qwen4_exp_text", "qwen4_exp")  # issue 34 (qwen4)
_EAGER_EXPERTS += ("deepseek_v4",)  # issue 34 (dsv4)
_EAGER_EXPERTS += ("param2moe", "minicpm5_moe", "ergo", "kolibri1_1")  # issue 44
ISSUE_34_CASES |= {"deepseek_v4"}  # issue 34 (dsv4)
ISSUE_34_CASES |= {"reformer", "reformer-masked"}  # issue 34 (reformer)
ISSUE_34_CASES |= {"blt"}  # issue 34 (blt)
ISSUE_34_CASES |= {"inkling2_text", "inkling2_loop_text"}  # issue 34 (inkling2)
ISSUE_34_CASES |= {"bigbird_pegasus-decoder", "prophetnet-decoder"}  # issue 34 (stacks)
DESIGNS_QUICK = frozenset({"smollm3", "deepseek_v3", "lfm2"})  # NoPE layers, latent attention, a hybrid


@dataclass(frozen=True)
class Case:
    name: str
    model_type: str
    config: dict
    compare: str = "exact"
    attention: str = "eager"
    word_id: int = 0
    boost: tuple[str, ...] = ()
    lm: bool = False  # built as its causal LM (a family without a base model class: TrOCR)
    cls: str | None = None  # the transformers class it is built as (a type no auto class maps: MusicGen's decoder)
    left_out: tuple[str, ...] = ()  # sub-config model types whose modules are built empty (Gemma 3n's timm vision
    # tower, which transformers builds only with timm installed: it never runs on text)
    stack: str = "encoder"  # the stack of an encoder-decoder its parity test reads ('decoder': --stack decoder)


def case(name: str) -> Case:
    model_type, config, *rest = CASES[name]
    options = rest[0] if rest else {}
    config = dict(config) if options.get("own") else {**SMALL, **config}
    return Case(name, model_type, config, options.get("compare", "exact"), options.get("attention", "eager"),
                options.get("word_id", 0), options.get("boost", ()), options.get("lm", False),
                options.get("cls"), options.get("left_out", ()), options.get("stack", "encoder"))  # fmt: skip


@contextmanager
def _left_out(model_types: tuple[str, ...]):
    """While active, transformers' AutoModel builds an empty module for a config of one of `model_types`."""
    from unittest import mock

    from transformers import AutoModel

    build_module = AutoModel.from_config

    def from_config(config, *args, **kwargs):
        if config.model_type in model_types:
            return torch.nn.Module()
        return build_module(config, *args, **kwargs)

    with mock.patch.object(AutoModel, "from_config", from_config) if model_types else nullcontext():
        yield


def build(name: str, dtype=None):
    """A tiny random base model of case `name` (eval mode, float64 unless the family cannot run in it), with
    non-trivial norms and biases."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    c = case(name)
    dtype = dtype or (torch.float32 if name in FLOAT32 else torch.float64)
    torch.manual_seed(0)
    config = AutoConfig.for_model(c.model_type, **c.config)
    extra = {"experts_implementation": "eager"} if c.model_type in _EAGER_EXPERTS else {}
    with _left_out(c.left_out):
        if c.cls:
            import transformers

            model = getattr(transformers, c.cls)._from_config(config, attn_implementation=c.attention, **extra)
        else:
            model_class = AutoModelForCausalLM if c.lm else AutoModel
            model = model_class.from_config(config, attn_implementation=c.attention, **extra)
    model = model.to(dtype).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname.lower() or pname.endswith(("bias", "self_attn.A")):  # Doge's dynamic-mask scale A
                p.add_(0.1 * torch.randn_like(p))
            elif pname.endswith("self_attn.sqk"):  # Dory's query scale per channel: not all equal
                p.mul_(1 + 0.2 * torch.randn_like(p))
            if any(name in pname for name in c.boost):
                p.copy_(torch.randn_like(p))
    return model


def _layers(model) -> torch.nn.ModuleList | list:
    """The model's layers in depth order; of a model whose layers come in blocks of pooled lengths (Funnel), the
    first block's (the layers at full length, those posprobe reads); of a model whose num_hidden_layers counts
    attention sublayers (LongCat-Flash: two per layer), its layers; of one that runs its stacks in cycles (HRM),
    each stored layer once, the first one called first."""
    from posprobe.architectures.table import config_value, stack_sizes
    from posprobe.families import family_for_type

    if hasattr(model, "local_encoder"):  # BLT: its byte stacks' layers (its global transformer runs over patches)
        return [*model.local_encoder.layers, *model.local_decoder.layers]
    n = model.config.get_text_config().num_hidden_layers  # a multimodal wrapper: its language model's layers
    family = family_for_type(model.config.model_type)
    if family is not None and family.sizes:  # the stack read has a layer count of its own (Whisper's decoder)
        n = config_value(stack_sizes(family, model.config.to_dict()), "layers")
    lists = [m for _, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    if lists:
        return lists[0]
    if hasattr(model, "L_module"):  # HRM: two stacks run in cycles, every stored layer at several depths
        return [*model.L_module.layers, *model.H_module.layers]
    return model.encoder.blocks[0] if hasattr(model, "encoder") else model.layers


def _depths(model, layers: int) -> int:
    """The attention calls of one forward pass: one per layer, or per depth where a block of layers runs several
    times (Inkling 2 Loop: posprobe's layer count)."""
    from posprobe.architectures.config import config_shape
    from posprobe.families import family_for_type

    family = family_for_type(model.config.model_type)
    if family is None or "loop" not in family.tensors:
        return layers
    return config_shape(model.config.to_dict(), model.config.model_type, family).layers


@dataclass(frozen=True)
class Reference:
    """The model's scores (L, H, n, n) and the pairs its softmax sees (L, n, n; (L, H, n, n) where a layer's mask
    differs per head): where `exact`, pre-softmax scores
    (before masks); else softmax inputs, equal to the scores up to what the model adds per query row."""

    scores: np.ndarray
    allowed: np.ndarray
    exact: bool


_RECORDED: list[tuple[np.ndarray, np.ndarray | None]] = []
_CALLERS: list = []  # (attention module, query tensor) of each call
RECORD = "posprobe-test-scores"


def _record(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention function for transformers' AttentionInterface: records q k^T * scaling (plus any bias the mask adds
    to the pairs it lets through) and the mask, once per attention module call (DiffLlama calls it twice in a row
    with the same q and k tensors, for two halves of its values: recorded once; ALBERT's one shared module runs at
    every depth on new tensors: recorded at each)."""
    from posprobe.kernel.routes import own_keys

    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = query @ key.transpose(-1, -2) * scaling
    if kwargs.get("softcap") is not None:  # Gemma 2: part of the pre-softmax scores
        scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
    mask = None if attention_mask is None else attention_mask[..., : key.shape[-2]]
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, torch.finfo(scores.dtype).min).to(scores.dtype)
    if kwargs.get("indices") is not None:  # an indexer's top-k keys per query: the eager path masks the others
        picked = torch.zeros(scores.shape[-2:], dtype=torch.bool).scatter(-1, kwargs["indices"][0].long(), True)
        mask = (torch.zeros_like(scores[0, 0]) if mask is None else mask[0, 0]).masked_fill(
            ~picked, torch.finfo(scores.dtype).min
        )[None, None]
    if kwargs.get("block_indices") is not None:  # a block indexer per key-head group: the module's own mask
        mask = module.indexer.build_block_mask(kwargs["block_indices"], attention_mask, key.shape[-2], scores.dtype,
                                               scores.device, None)  # (B, H, n, n)  # fmt: skip
    recorded = scores  # plus what the mask adds to the pairs it lets through: 0, or Doge's dynamic-mask bias
    if mask is not None:
        recorded = scores + torch.where(mask > torch.finfo(mask.dtype).min / 2, mask, 0.0)
    pairs = mask
    own = own_keys(module, query, key)  # DeepSeek V4: entries pooled over blocks follow the sequence's keys
    recorded, pairs = recorded[..., :own], None if mask is None else mask[..., :own]  # not pairs: cut
    if not _CALLERS or _CALLERS[-1][0] is not module or _CALLERS[-1][1] is not query:
        # the pairs let through: (n, n), or (H, n, n) per head where a block indexer picks keys per key-head group
        # (Doge's per-head mask is a bias on the same pairs for every head)
        kept = None if pairs is None else pairs[0] if kwargs.get("block_indices") is not None else pairs[0, 0]
        _RECORDED.append((recorded[0].detach().double().numpy(), None if kept is None else kept.double().numpy()))
    _CALLERS.append((module, query))
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(-1)
    return (probs @ value).transpose(1, 2).contiguous(), probs


class _SoftmaxInputs:
    """Records every softmax input of shape (1, H, n, n) or (H, n, n) while active (models outside the
    AttentionInterface). `pooled_heads`: a family whose keys are followed by pooled entries (DeepSeek V4): only
    (1, H, n, n + extra) inputs of its H heads are kept, their first n columns (the sequence's keys). Where `model`
    is given, none inside its modules whose softmax runs over depth, not positions (Inkling 2's attention over blocks
    of layers: `capture.eager.depth_attention_modules`)."""

    def __init__(self, n: int, pooled_heads: int | None = None, model=None):
        self.n, self.inputs, self.pooled_heads, self.model, self.hooks = n, [], pooled_heads, model, []

    def __enter__(self):
        self.functional, self.method, self.torch = torch.nn.functional.softmax, torch.Tensor.softmax, torch.softmax
        functional, method, inputs, n = self.functional, self.method, self.inputs, self.n
        torch_softmax = self.torch  # Funnel calls torch.softmax
        inside = []  # functional softmax calls the method: record each call once
        from posprobe.capture.eager import depth_attention_modules

        for module in [] if self.model is None else depth_attention_modules(self.model):
            self.hooks.append(module.register_forward_pre_hook(lambda *_: inside.append(1)))
            self.hooks.append(module.register_forward_hook(lambda *_: inside.pop() and None))  # returns None

        pooled_heads = self.pooled_heads

        def keep(x):
            if inside:
                return
            if pooled_heads is not None:  # keys, a sink column, pooled entries: the keys' n columns
                if x.ndim == 4 and x.shape[:3] == (1, pooled_heads, n) and x.shape[-1] > n:
                    inputs.append(x[0, ..., :n].detach().double().numpy())
            elif x.shape[-2:] == (n, n) and (x.ndim == 3 or x.ndim == 4 and x.shape[0] == 1):
                inputs.append(x.reshape(-1, n, n).detach().double().numpy())  # (H, n, n); batch 1 (or merged)
            elif x.shape[-2:] == (n, n + 1) and x.ndim == 4 and x.shape[0] == 1:  # learned sinks: last column
                inputs.append(x[0, ..., :-1].detach().double().numpy())
            elif x.ndim == 4 and x.shape[:2] == (1, n) and x.shape[-1] % 2 and x.shape[-1] < n:
                inputs.append(_from_band(x[0].detach().double().numpy()))  # Longformer's (n, H, 2w + 1) band

        def patched_functional(x, *args, **kwargs):
            keep(x)
            inside.append(1)
            try:
                return functional(x, *args, **kwargs)
            finally:
                inside.pop()

        def patched_method(x, *args, **kwargs):
            keep(x)
            return method(x, *args, **kwargs)

        def patched_torch(x, *args, **kwargs):  # (1, H, n, n) only: routers call torch.softmax too (ZAYA)
            if x.ndim == 4:
                keep(x)
            return torch_softmax(x, *args, **kwargs)

        torch.nn.functional.softmax, torch.Tensor.softmax = patched_functional, patched_method
        torch.softmax = patched_torch
        self.chunks = _NeighbourChunkInputs(n, inputs).__enter__()
        return self

    def __exit__(self, *exc):
        torch.nn.functional.softmax, torch.Tensor.softmax = self.functional, self.method
        torch.softmax = self.torch
        self.chunks.__exit__(*exc)
        for hook in self.hooks:
            hook.remove()


class _NeighbourChunkInputs:
    """Records, into `inputs`, the (H, n, n) softmax inputs of Reformer's local layers, which take no softmax call:
    exp(dots - logsumexp(dots)) over (chunks, chunk, keys of the chunk and its neighbours), the keys' positions the
    ones the module gathers with `_look_adjacent`; pairs it does not compute, or masks (its -1e9), are -inf. The
    module's padded sequence (a multiple of its chunk lengths) is cut to the first n positions."""

    def __init__(self, n: int, inputs: list):
        self.n, self.inputs = n, inputs

    def __enter__(self):
        from transformers.models.reformer import modeling_reformer as reformer

        self.module, self.forward = reformer.LocalSelfAttention, reformer.LocalSelfAttention.forward
        original, n, inputs, logsumexp = self.forward, self.n, self.inputs, torch.logsumexp

        def forward(module, *args, **kwargs):
            seen = {}
            look = module._look_adjacent

            def adjacent(vectors, before, after):
                out = look(vectors, before, after)
                if vectors.dtype == torch.long:  # the key positions of every chunk: (1, H, chunks, keys)
                    seen["keys"] = out
                return out

            def record(x, *a, **k):
                seen["dots"] = x
                return logsumexp(x, *a, **k)

            module._look_adjacent, torch.logsumexp = adjacent, record
            try:
                out = original(module, *args, **kwargs)
            finally:
                del module._look_adjacent
                torch.logsumexp = logsumexp
            dots = seen["dots"][0].detach().double()  # (H, N, N) or (H, chunks, chunk, keys)
            dots = torch.where(dots == float(module.mask_value_float32), -torch.inf, dots)
            if dots.ndim == 3:
                full = dots
            else:
                heads, chunks, chunk, _ = dots.shape
                full = torch.full((heads, chunks * chunk, chunks * chunk), -torch.inf, dtype=dots.dtype)
                keys = seen["keys"][0]  # (H, chunks, keys)
                for c in range(chunks):
                    for q in range(chunk):
                        full[:, c * chunk + q].scatter_(-1, keys[:, c], dots[:, c, q])
            inputs.append(full[:, :n, :n].numpy())
            return out

        self.module.forward = forward
        return self

    def __exit__(self, *exc):
        self.module.forward = self.forward


class _SdpaInputs:
    """Records q k^T * scale + mask of every `scaled_dot_product_attention` call while active, as (H, n, n)."""

    def __init__(self):
        self.inputs = []

    def __enter__(self):
        self.original = original = torch.nn.functional.scaled_dot_product_attention
        inputs = self.inputs

        def patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
            key_rep = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            scores = query @ key_rep.transpose(-1, -2) * (query.shape[-1] ** -0.5 if scale is None else scale)
            if attn_mask is not None:
                scores = scores + attn_mask
            inputs.append(scores[0].detach().double().numpy())
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, **kwargs)  # fmt: skip

        torch.nn.functional.scaled_dot_product_attention = patched
        return self

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = self.original


def _from_band(band: np.ndarray) -> np.ndarray:
    """Sliding-chunk scores (n, H, 2w + 1), column c = key i + c - w, as (H, n, n) (-inf off the band)."""
    n, heads, width = band.shape
    w = width // 2
    full = np.full((heads, n, n), -np.inf)
    for i in range(n):
        for c in range(width):
            if 0 <= i + c - w < n:
                full[:, i, i + c - w] = band[i, :, c]
    return full


def _on_one_head_axis(layers: list[np.ndarray]) -> np.ndarray:
    """Per-layer scores (H_l, n, n) stacked as (L, H, n, n), H the most heads of any layer: a layer's missing heads
    NaN (Laguna's query-head count per layer, SPEC §9)."""
    heads = max(s.shape[0] for s in layers)
    return np.stack([np.concatenate([s, np.full((heads - s.shape[0], *s.shape[1:]), np.nan)]) for s in layers])


def reference_scores(model, n: int, word_id: int = 0, stack: str = "encoder") -> Reference:
    """The model's scores of every layer on n copies of the average word (token `word_id`), each layer fed the
    embedding-level input; of an encoder-decoder's decoder where `stack` is 'decoder' (run without encoder
    states)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(RECORD, _record)
    ALL_MASK_ATTENTION_FUNCTIONS.register(RECORD, eager_mask)  # the masks eager attention gets, windows included
    from posprobe.capture.model import stack_to_run

    # an encoder-decoder's encoder, or its decoder where the encoder reads no text or the test reads the decoder
    model = model.get_decoder() if stack == "decoder" else stack_to_run(model)
    embeddings = model.get_input_embeddings()
    tables = list(embeddings) if isinstance(embeddings, torch.nn.ModuleList) else [embeddings]  # one per codebook
    with torch.no_grad():
        for table in tables:  # token word_id = the average word (after the mean is taken); MusicGen: one per codebook
            table.weight[word_id] = table.weight.mean(0)
    layers = _layers(model)
    first: dict[str, torch.Tensor] = {}

    def feed(index, original):  # replaces the layer's forward (some encoders call layer.forward directly)
        def forward(*args, **kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if index == 0 and "x" not in first:  # the first call's input (HRM calls its layers again and again)
                first["x"] = hidden.clone()  # later layers must not see in-place changes
            elif args:  # the layer input, and keys / values taken from it as well (Funnel passes them apart)
                args = tuple(first["x"] if a is hidden else a for a in args)
            else:
                kwargs["hidden_states"] = first["x"]
            return original(*args, **kwargs)

        return forward

    for i, layer in enumerate(layers):
        layer.forward = feed(i, layer.forward)
    # a layer with several attention sublayers, each behind its own input norm (LongCat-Flash's input_layernorm[s]):
    # the later sublayers are fed the embedding-level input too
    sublayer_norms = [
        norm
        for layer in layers
        if isinstance(getattr(layer, "input_layernorm", None), torch.nn.ModuleList)
        for norm in layer.input_layernorm[1:]
    ]
    hooks = [norm.register_forward_pre_hook(lambda module, args: (first["x"], *args[1:])) for norm in sublayer_norms]
    # attention over depth (Inkling 2's over earlier blocks' states and its own input, its loop's over the earlier
    # pass's): each state it reads is the embedding-level input too
    from posprobe.capture.eager import depth_attention_modules

    def blocks_of_first(module, args):
        return (first["x"].unsqueeze(-2).repeat(1, 1, args[0].shape[-2], 1), first["x"], *args[2:])

    hooks += [module.register_forward_pre_hook(blocks_of_first) for module in depth_attention_modules(model)]
    implementation = model.config._attn_implementation
    exact = implementation == "eager" and bool(getattr(type(model), "_supports_attention_backend", False))
    ids = torch.full((len(tables), n), word_id, dtype=torch.long)  # MusicGen: one row per codebook
    inputs = dict(input_ids=ids)
    hashed = getattr(model, "encoder_hash_tok_embedding", None)
    if hashed is not None:  # BLT: each byte adds one row of every hashed n-gram table; the average input, every slice's
        rows = model.config.encoder_hash_byte_group_vocab  # average row (the hashes of a text pick rows by content)
        with torch.no_grad():
            x = tables[0].weight[word_id] + hashed.weight.reshape(-1, rows, hashed.weight.shape[-1]).mean(1).sum(0)
        inputs = dict(inputs_embeds=x.expand(1, n, -1))
    try:
        _RECORDED.clear()
        _CALLERS.clear()
        with torch.no_grad():
            if exact:
                model.set_attn_implementation(RECORD)
                model(**inputs, use_cache=False)
                scores = _on_one_head_axis([s for s, _ in _RECORDED])
                masks = [np.zeros((n, n)) if m is None else m for _, m in _RECORDED]
                if any(m.ndim == 3 for m in masks):  # a mask per head somewhere (a block indexer per group)
                    masks = [np.broadcast_to(m, scores.shape[1:]) for m in masks]
                allowed = np.stack([m > -1e30 for m in masks])
            else:
                with _SoftmaxInputs(n, model=model) if implementation == "eager" else _SdpaInputs() as capture:
                    model(**inputs, use_cache=False)
                scores = np.stack(capture.inputs[: _depths(model, len(layers))])
                # masks add the dtype's minimum (or -inf); OpenAI GPT sets masked scores to -1e4 exactly
                allowed = (scores[:, 0] > -1e30) & (scores[:, 0] != -1e4)
        return Reference(scores, allowed, exact)
    finally:
        for layer in layers:
            del layer.forward  # the class's own again
        for hook in hooks:
            hook.remove()
        model.set_attn_implementation(implementation)
