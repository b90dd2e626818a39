"""Model access: the only layer that finds checkpoints and reads their weights.

`resolve` turns a model argument (hub id, local folder, or nothing = the packaged MiniLM) into a local
folder and checks its config.json (`config`); `safetensors_format` checks a safetensors header as the format
promises; `weights` reads single tensors lazily from safetensors; `architectures` knows where each model
family keeps its position table, embedding LayerNorm, projection and Q/K weights; `loading` holds the checks
around building a model with transformers (used by `posprobe.load_model`).
"""

from posprobe.checkpoint.architectures import (
    SUPPORTED_MODEL_TYPES,
    AttentionWeights,
    EmbeddingInputs,
    PositionTable,
    read_attention_weights,
    read_embedding_inputs,
    read_position_table,
)
from posprobe.checkpoint.resolve import DEFAULT_MODEL_NAME, ModelSource, default_model_dir, resolve_model
from posprobe.checkpoint.weights import WeightReader

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelSource",
    "default_model_dir",
    "resolve_model",
    "WeightReader",
    "AttentionWeights",
    "EmbeddingInputs",
    "PositionTable",
    "SUPPORTED_MODEL_TYPES",
    "read_attention_weights",
    "read_embedding_inputs",
    "read_position_table",
]
