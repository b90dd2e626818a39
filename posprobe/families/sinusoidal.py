"""Sinusoidal absolute position tables (SPEC §9), built as the family's own transformers module builds them.

Marian and Pegasus store the table they were built with (`embed_positions.weight`): it is read. M2M100 and
XGLM keep it in a non-persistent buffer: the family's module (`Family.tensors['positions_class']`) is built
from the config and asked for positions 0..n-1 of a sequence without padding (M2M100 numbers them from
`padding_idx + 1`, XGLM from its offset 2: the module knows); CTRL's comes from a function of its module
(`Family.tensors['positions_function']`), MusicGen's from a static method of its module (`positions_table`: rows
0..n-1). No model is built. The result is an
`E_P` (n, d) like a learned table, so `toeplitz`, `fhat` (paper/faithful) and `profiles` apply unchanged.
"""

from __future__ import annotations

import importlib

import numpy as np


def build_table(family, config: dict, n: int, d: int) -> np.ndarray:
    """E_P (n, d) float64 from the family's positional module (float32 where the model computes in float32)."""
    import torch

    if "positions_table" in family.tensors:  # MusicGen: a static method of its module, (rows, width) in float32
        module_name, path = family.tensors["positions_table"].split(":")
        build = importlib.import_module(module_name)
        for part in path.split("."):
            build = getattr(build, part)
        with torch.no_grad():
            return build(n, d).to(torch.float32).reshape(n, d).double().numpy()
    if "positions_function" in family.tensors:  # CTRL: a function of (rows, width, dtype), computed in float32
        module_name, function_name = family.tensors["positions_function"].split(":")
        build = getattr(importlib.import_module(module_name), function_name)
        with torch.no_grad():
            return build(n, d, torch.float32).reshape(n, d).double().numpy()
    module_name, class_name = family.tensors["positions_class"].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    pad = config.get("pad_token_id")
    with torch.no_grad():
        module = cls(n, d, pad)
        if hasattr(module, "create_weight"):  # Marian / Pegasus: an Embedding filled by create_weight()
            return module.create_weight()[:n].double().numpy()
        if family.tensors.get("positions_from") == "position_ids":  # XGLM: numbered from its offset
            out = module(position_ids=torch.arange(n)[None])
        else:  # M2M100: position ids from the input ids; any id that is not padding
            token = 0 if pad != 0 else 1
            out = module(input_ids=torch.full((1, n), token, dtype=torch.long))
    return out.reshape(n, d).double().numpy()
