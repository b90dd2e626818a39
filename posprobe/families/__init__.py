"""Reading a model's tensors as the family table says (`context.ModelContext`), one score module per position kind.

Adding a family
---------------
1. Add a `Family` entry to `posprobe/architectures/table.py` (its model types, its position `kind`, `causal`, and the
   tensor-name suffixes: `word`, `query`/`key` (+ `qkv` layout), `pre_norm` and `norm`, `qk_norm`, `embed_scale`,
   `rotary_class` and `rotary_layout`, `switches` for config switches, `windows` for local layers,
   family-specific names in `tensors`). A family of an existing kind needs nothing else; a multimodal wrapper
   whose language model has an entry is one `_wrapper(...)` line (`families.language_model`).
2. Add one tiny config to the test matrix (`tests/family_models.py`, `CASES`); the parity test then checks
   posprobe's scores against the real attention module of a random model built from it, every layer, float64,
   and the pairs each layer attends against `ModelContext.layer_kinds`.

A new kind also needs a score module (listed in `context.SCORE_MODULES`) defining

    content_free_scores(ctx: ModelContext, layer: int, n: int, stack: str, inputs: LayerInputs | None)
        -> np.ndarray   # (H, n, n) float64

(`ModelContext` is `posprobe.families.context.ModelContext`, the one model reader.)

`F_hat(i, j)` of SPEC §9 for query i, key j (k = j - i), every head of `layer` (0-based, already checked) of
stack `stack` ('encoder' or 'decoder'; one-stack families get 'encoder'), for the first `n` positions (already
checked against the model's maximum). It reads tensors only through `ctx` (`ctx.reader`, `ctx.family`,
`ctx.config`, and helpers: `ctx.tensor(pattern, layer, stack)`, `ctx.word_input(layer, stack, inputs)`,
`ctx.query_key(layer, stack, inputs)`, ...): lazily, never building the model. Pure numpy/torch; no printing.
`inputs` (`context.LayerInputs`, SPEC §13) are data-conditioned layer inputs, or None for the embedding level: an
argument handed down, never state of the reader.

and

    toeplitz_by_construction(ctx: ModelContext, stack: str, conditioned: bool) -> bool

True when, for an input that is the same at every position (`conditioned`: a data-conditioned mean, SPEC §13), the
kind's scores depend on k = j - i alone whatever the weights (their Toeplitz R^2 is then reported as by
construction, not measured; a test checks the matrices of every kind where it says True).
"""

from posprobe.architectures.table import (
    FAMILIES,
    KIND_NAMES,
    KINDS,
    Family,
    config_value,
    family_for_type,
    model_types,
    position_kind,
)

__all__ = [
    "FAMILIES",
    "KINDS",
    "KIND_NAMES",
    "Family",
    "config_value",
    "family_for_type",
    "model_types",
    "position_kind",
]

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
