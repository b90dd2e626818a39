"""Model access: finding checkpoints and reading their files, nothing about what a family's tensors mean.

`resolve` turns a model argument (hub id, local folder, or nothing = the packaged MiniLM) into a local
folder and checks its config.json (`config`); `safetensors_format` checks a safetensors header as the format
promises; `weights` reads single tensors lazily from safetensors; `in_memory` reads a loaded model's state
dict the same way; `loading` holds the checks around building a model with transformers (used by
`posprobe.load_model`). What the tensors mean (layouts, norms, positions) is the model reader's job:
`posprobe.families.context.ModelContext`.
"""

from posprobe.checkpoint.resolve import DEFAULT_MODEL_NAME, ModelSource, default_model_dir, resolve_model
from posprobe.checkpoint.weights import WeightReader

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelSource",
    "default_model_dir",
    "resolve_model",
    "WeightReader",
]
