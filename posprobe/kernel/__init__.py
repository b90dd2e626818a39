"""The attention kernel: the one attention function posprobe runs a model's layers with, and the taps it hands.

- `taps.py`: `Taps` (functions per named site: query, key, scores, pattern, row, head_output; layers addressed by
  `module.layer_idx`), carried down a forward pass as the keyword `posprobe_taps`, and `Call` (what a tap sees);
- `routes.py`: `attention`, registered in transformers' AttentionInterface under one name per route (eager,
  sdpa, sdpa with additive masks, blocks of query rows), the one place that computes an attention softmax to
  record, read or edit, and `verify_against_eager`, the first-batch check of a run on it.
"""

from posprobe.kernel.routes import BLOCKS, EAGER, SDPA, SDPA_ADDITIVE, attention, register, verify_against_eager
from posprobe.kernel.taps import SITES, TAPS_KEY, Call, Taps

__all__ = [
    "BLOCKS",
    "EAGER",
    "SDPA",
    "SDPA_ADDITIVE",
    "SITES",
    "TAPS_KEY",
    "Call",
    "Taps",
    "attention",
    "register",
    "verify_against_eager",
]
