"""Each command's defaults, defined once: the command line shows them (the `typer.Option` defaults in
`posprobe/cli/*.py`), the pipeline function the command calls takes them as its own defaults, and `posprobe report`
runs its sections with them (`report/library.py` passes only what a section's command line names, the rest falls
to these). Change a default here and the command, the library and the report change together.

Plain values, importing nothing, so that `posprobe --help` and every command read this module without loading torch
or scipy (the states' four equal the constants of the analyses that use them: tests/test_defaults.py). Lists are
tuples; the command line shows them comma-joined (`joined`).
"""

from __future__ import annotations

# ---- shared by several commands
MODE = "paper"  # fhat, profiles, fit-tisa, compare: SPEC §3's formula (faithful: the real first-layer input)
ALL_LAYERS = "all"  # --layers of profiles, fit-tisa, rotary: every layer (the pipelines' None)
ROPE_SCALING = "none"  # rotary, context: the model as it is (no rotary scaling variant)
MIN_TEXTS = 16  # states' positional vectors, fhat/profiles --input position-mean
TEXT = "builtin:sentences"  # attention, states (they need texts): the 144 packaged sentences (posprobe.corpora)
LONG_TEXT = "builtin:kjv"  # context's --text and needle's --haystack: the King James Bible, long documents

# ---- fhat
FHAT_LAYER = 0

# ---- fit-tisa
FIT_TISA_KERNELS = (5,)  # S, kernels per head
FIT_TISA_SEED = 0
FIT_TISA_ORIENTATION = "posprobe"  # k = j - i, arrays (L, H, S): what `retrofit` reads

# ---- attention
ATTENTION_WINDOW = 20  # the figures show k = -W..W (at most n - 1)
ATTENTION_MIN_PAIRS = 100  # offsets with fewer pairs do not enter weights_correlation

# ---- states
STATES_MAE_SAMPLE = 2048  # tokens the probe's MAE is measured on
STATES_SEED = 0
STATES_NULL_DRAWS = 8  # permutation-null draws of the Gram R²
STATES_CONTROLS = 5  # control permutations of the probe

# ---- context (SPEC §17)
CONTEXT_TEXT = LONG_TEXT
CONTEXT_LENGTHS = (512, 1024, 2048)
CONTEXT_WINDOWS = 4  # windows of the longest length
CONTEXT_BATCH_SIZE = 1  # windows per forward pass

# ---- needle (SPEC §18)
NEEDLE_MODEL = "SmolLM2-135M-Instruct"  # the packaged causal LM
NEEDLE_HAYSTACK = LONG_TEXT
NEEDLE_LENGTHS = (256, 512, 1024)
NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
NEEDLE_TRIALS = 3
NEEDLE_SEED = 0
NEEDLE_DIGITS = 5  # of the random pass key


def joined(values) -> str:
    """A tuple of defaults as the command line takes it: (512, 1024) -> '512,1024', (0.0, 0.25) -> '0,0.25'."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
