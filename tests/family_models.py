"""The family test matrix: one tiny random model per analysable family of the family table (hidden 32, 2 layers),
and the reference the content-free scores must equal: the model's own pre-softmax scores on the constant
sequence of the average word embedding, every layer fed the embedding-level input (SPEC §9)."""

from __future__ import annotations

import numpy as np
import torch

SMALL = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
# family name -> (model_type, config overrides)
MATRIX = {
    "llama": ("llama", dict(num_key_value_heads=2, max_position_embeddings=64, attention_bias=True,
                            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0, original_max_position_embeddings=16))),
    "mistral": ("mistral", dict(num_key_value_heads=1, max_position_embeddings=64, rope_theta=500.0)),
    "mixtral": ("mixtral", dict(num_key_value_heads=2, max_position_embeddings=64, num_local_experts=2)),
    "qwen2": ("qwen2", dict(num_key_value_heads=2, max_position_embeddings=64,
                            rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16))),
    "qwen3": ("qwen3", dict(num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                            rope_scaling=dict(rope_type="linear", factor=2.0))),
    "gemma": ("gemma", dict(num_key_value_heads=1, head_dim=8, max_position_embeddings=64)),
    "gemma2": ("gemma2", dict(num_key_value_heads=2, head_dim=8, max_position_embeddings=64, query_pre_attn_scalar=6,
                              attn_logit_softcapping=3.0, sliding_window=4)),
    "phi": ("phi", dict(max_position_embeddings=64, partial_rotary_factor=0.5, qk_layernorm=True)),
    "phi3": ("phi3", dict(num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=16,
                          pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          rope_scaling=dict(type="longrope", short_factor=[1.0, 1.5, 2.0, 2.5],
                                            long_factor=[1.0, 2.0, 3.0, 4.0]))),
    "starcoder2": ("starcoder2", dict(num_key_value_heads=2, max_position_embeddings=64)),
    "gpt_neox": ("gpt_neox", dict(max_position_embeddings=64, rotary_pct=0.25, attention_bias=True)),
    "bloom": ("bloom", dict(vocab_size=99, hidden_size=32, n_layer=2, n_head=4)),
    "mpt": ("mpt", dict(vocab_size=99, d_model=32, n_layers=2, n_heads=4, max_seq_len=64, expansion_ratio=2)),
}  # fmt: skip
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
# Sinusoidal absolute tables: compared through the learned-table path (faithful mode).
SINUSOIDAL = {
    "marian": ("marian", _SEQ2SEQ),
    "pegasus": ("pegasus", _SEQ2SEQ),
    "m2m_100": ("m2m_100", _SEQ2SEQ),
    "xglm": ("xglm", dict(vocab_size=99, d_model=32, num_layers=2, attention_heads=4, ffn_dim=37,
                          max_position_embeddings=64, scale_embedding=True, pad_token_id=1)),
}  # fmt: skip
# Learned tables of families without a fixture in conftest.py: compared through the table path (faithful mode).
LEARNED_EXTRA = {
    "ernie": ("ernie", dict(max_position_embeddings=64, intermediate_size=37)),
    "camembert": ("camembert", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1)),
    "data2vec-text": ("data2vec-text", dict(max_position_embeddings=66, intermediate_size=37, pad_token_id=1)),
    "megatron-bert": ("megatron-bert", dict(max_position_embeddings=64, intermediate_size=37)),
}
_OWN_CONFIG = {"bloom", "mpt", *SINUSOIDAL}


def build(family: str, dtype=torch.float64):
    """A tiny random base model of `family` (eval mode, float64), with non-trivial norms and biases."""
    from transformers import AutoConfig, AutoModel

    model_type, overrides = {**MATRIX, **SINUSOIDAL, **LEARNED_EXTRA}[family]
    kwargs = {**SMALL, **overrides} if model_type not in _OWN_CONFIG else dict(overrides)
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **kwargs)
    extra = {"experts_implementation": "eager"} if model_type == "mixtral" else {}
    model = AutoModel.from_config(config, attn_implementation="eager", **extra).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _layers(model) -> torch.nn.ModuleList:
    n = model.config.num_hidden_layers
    lists = [m for _, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    return lists[0]


RECORD = "posprobe-test-scores"
_RECORDED: list[np.ndarray] = []


def _record(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention function for transformers' AttentionInterface: records q k^T * scaling (pre-mask)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = query @ key.transpose(-1, -2) * scaling
    if kwargs.get("softcap") is not None:  # Gemma 2: part of the pre-softmax scores
        scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
    _RECORDED.append(scores[0].detach().double().numpy())
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    probs = scores.softmax(-1)
    return (probs @ value).transpose(1, 2).contiguous(), probs


def model_scores(model, n: int) -> tuple[np.ndarray, bool]:
    """(L, H, n, n) scores of every layer on n copies of the average word, each layer fed the embedding-level
    input; and whether they are exact pre-softmax scores (True) or log-probabilities, equal to the scores up to
    a per-row constant on the pairs the model lets attend (False: families that do not route through
    AttentionInterface)."""
    from transformers import AttentionInterface

    AttentionInterface.register(RECORD, _record)
    if getattr(model.config, "is_encoder_decoder", False):
        model = model.get_encoder()
    embeddings = model.get_input_embeddings()
    with torch.no_grad():
        embeddings.weight[0] = embeddings.weight.mean(0)  # token 0 = the average word (after the mean is taken)
    layers = _layers(model)
    first: dict[str, torch.Tensor] = {}

    def pre_hook(index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if index == 0:
                first["x"] = hidden
                return None
            if args:
                return (first["x"], *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": first["x"]}

        return hook

    handles = [layer.register_forward_pre_hook(pre_hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    exact = bool(getattr(type(model), "_supports_attention_backend", False))
    try:
        _RECORDED.clear()
        if exact:
            model.set_attn_implementation(RECORD)
        with torch.no_grad():
            out = model(input_ids=torch.zeros(1, n, dtype=torch.long), output_attentions=not exact, use_cache=False)
        if exact:
            return np.stack(_RECORDED), True
        with np.errstate(divide="ignore"):  # masked pairs have probability 0
            return np.stack([np.log(a[0].double().numpy()) for a in out.attentions]), False
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation("eager")
