"""Tiny GGUF files written in code, as llama.cpp's converter writes them, for the GGUF tests.

`write_gguf(model, path, qtype)` writes a tiny transformers model (Llama, Qwen2 or GPT-2) with the gguf package's
own writer: llama.cpp's tensor names (gguf's `TensorNameMap`), its metadata keys, its layouts (Llama's Q/K rows
permuted so that the two halves of every rotary head interleave; GPT-2's Conv1D weights stored as (out, in)),
norms and biases in F32 and matrices in `qtype` (F32, F16, or a block quantisation such as Q8_0, de/quantised by
the gguf package). `byte_offsets(path)` finds where each header field lies, for tests that damage one of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "gpt2": "gpt2"}
# Conv1D weights that llama.cpp stores transposed
_GPT2_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def tiny_llama(tied: bool = False, seed: int = 0):
    """A tiny random Llama (4 query heads, 2 key/value heads of size 16, hidden 64) as a causal LM."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500.0,
        rms_norm_eps=float(np.float32(1e-5)),
        tie_word_embeddings=tied,
    )
    return _perturb_norms(tf.LlamaForCausalLM(config)).eval()


def tiny_qwen2(seed: int = 0):
    """A tiny random Qwen2 (biases on Q/K/V; rotary halves not permuted by llama.cpp) with tied embeddings."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.Qwen2Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=float(np.float32(1e-6)),
        tie_word_embeddings=True,
    )
    model = tf.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return _perturb_norms(model).eval()


def tiny_gpt2(seed: int = 0):
    """A tiny random GPT-2 (hidden 64, 4 heads, 1024 learned positions: transformers' GGUF mapping reads a GPT-2's
    context length into `n_ctx`, so its table keeps GPT2Config's default 1024 rows)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.GPT2Config(vocab_size=96, n_positions=1024, n_embd=64, n_head=4, n_layer=2, bos_token_id=0,
                           eos_token_id=0, layer_norm_epsilon=float(np.float32(1e-5)))  # fmt: skip
    model = tf.GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return _perturb_norms(model).eval()


def _perturb_norms(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of a rotary Q or K projection (rows = heads * d_h): within every head, the row of
    dimension i of the first half and the row of dimension i of the second half become rows 2i and 2i + 1."""
    d_h = rows.shape[0] // heads
    per_head = rows.reshape(heads, 2, d_h // 2, *rows.shape[1:])  # (head, half, i, ...)
    return np.ascontiguousarray(np.swapaxes(per_head, 1, 2)).reshape(rows.shape)  # (head, i, half, ...)


def write_gguf(model, path: Path, qtype: str = "F32") -> Path:
    """Write `model` (tiny_llama / tiny_qwen2 / tiny_gpt2) as a GGUF file the way llama.cpp converts it."""
    import gguf

    config = model.config
    arch = GGUF_ARCH[config.model_type]
    arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    name_map = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(getattr(config, "intermediate_size", None) or 4 * config.hidden_size)
    writer.add_head_count(config.num_attention_heads)
    if arch == "gpt2":
        writer.add_layer_norm_eps(config.layer_norm_epsilon)
    else:
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
        writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    writer.add_file_type({"F32": 0, "F16": 1}.get(qtype, 7))
    quant = gguf.GGMLQuantizationType[qtype]
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and (config.tie_word_embeddings or arch == "gpt2"):
            continue
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = name_map.get_name(base)
        assert gguf_name is not None, hf_name
        data = tensor.float().numpy()
        if arch == "llama" and base.endswith("self_attn.q_proj"):
            data = llama_cpp_permute(data, config.num_attention_heads)
        if arch == "llama" and base.endswith("self_attn.k_proj"):
            data = llama_cpp_permute(data, config.num_key_value_heads)
        if arch == "gpt2" and hf_name.endswith(_GPT2_TRANSPOSED):
            data = np.ascontiguousarray(data.T)
        if data.ndim < 2 or quant == gguf.GGMLQuantizationType.F32:  # norms and biases stay F32
            writer.add_tensor(f"{gguf_name}.{suffix}", data.astype(np.float32))
        elif quant == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(f"{gguf_name}.{suffix}", data.astype(np.float16))
        else:
            packed = gguf.quants.quantize(data, quant)
            writer.add_tensor(f"{gguf_name}.{suffix}", packed, raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def byte_offsets(path: Path, reader=None) -> dict:
    """Where the header fields of a GGUF file lie, found with the gguf package's own reader (`reader`, if already
    made for `path`): {'kv': {key: offset of the entry}, 'kv_type': {key: offset of its value type}, 'tensors':
    {name: {part: offset}}} with parts name_len, name, n_dims, dims, type, offset; plus 'data_start'."""
    import gguf

    reader = reader if reader is not None else gguf.GGUFReader(str(path))
    base = reader.data.__array_interface__["data"][0]

    def at(part) -> int:
        return part.__array_interface__["data"][0] - base

    kv, kv_type = {}, {}
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            kv[key] = field.offset
            kv_type[key] = at(field.parts[2])
    tensors = {}
    for tensor in reader.tensors:
        parts = tensor.field.parts
        tensors[tensor.name] = dict(zip(("name_len", "name", "n_dims", "dims", "type", "offset"), map(at, parts)))
    return {"kv": kv, "kv_type": kv_type, "tensors": tensors, "data_start": reader.data_offset}


def save_dequantized(model, folder: Path) -> Path:
    """Save a model transformers loaded from a GGUF file as an ordinary safetensors checkpoint (transformers
    refuses to save a model it marks as GGUF-quantised; its weights are de-quantised float32 already)."""
    import copy

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    fresh = type(model)(config)
    fresh.load_state_dict(model.state_dict())
    fresh.save_pretrained(folder)
    return Path(folder)


def rewrite_gguf(source: Path, target: Path, set_fields=None, drop_fields=(), drop_tensors=()) -> Path:
    """Copy a GGUF file with metadata fields replaced (`set_fields`: {key: (value, GGUFValueType)}) or dropped,
    and tensors dropped: a crafted file, written with the gguf package's own writer (so its header is valid)."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    set_fields = dict(set_fields or {})
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_fields or key in set_fields:
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for key, (value, value_type) in set_fields.items():
        writer.add_key_value(key, value, value_type)
    for tensor in reader.tensors:
        if tensor.name in drop_tensors:
            continue
        data = np.array(tensor.data)
        if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(tensor.name, data)
        else:
            writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(target)
