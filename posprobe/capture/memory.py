"""Memory a capture needs, estimated from shapes, against the memory the device has: a run that cannot fit says so
in one line before the batch that would not fit runs, instead of being killed by the kernel (or CUDA) mid-run.

The estimate counts the largest tensors a batch makes (the recorded scores and probabilities, the model's own for
one layer, the masks, the reducers' float64 sums) and multiplies them by `CALIBRATION`, below the measured ratio of
the peak to those tensors (1.9 on a 2-layer, 2-head Llama at 4096 tokens, RESULTS.md "Scale-out": the rest is
temporaries of the reducers and the first batch's check), so that a refusal stays true; a run the estimate lets
through may still need more. On the blockwise route (SPEC §19) the estimate is `attention_block_bytes`: one block
of query rows and one layer's queries, keys and values, linear in the length.
Dimensions: B texts in a batch, m its longest sequence, L layers, H heads.
"""

from __future__ import annotations

from typing import Any

from posprobe.errors import PosprobeError

GIB = 2**30
CALIBRATION = 1.5  # peak / the tensors counted in attention_batch_bytes: 1.9 measured, kept below it


def available_bytes(device: Any) -> int | None:
    """Free memory on `device`: CUDA's free memory, or the CPU's MemAvailable (/proc/meminfo); None where unknown."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def attention_batch_bytes(
    n_layers: int, n_heads: int, batch: int, length: int, element_bytes: int, scores: bool, probs: bool
) -> int:
    """At least what recording one batch's attention takes: every layer's scores and/or probabilities
    (L x B x H x m x m in the model's dtype), the model's own scores and probabilities of the layer it runs
    (2 x B x H x m x m), the allowed and counted pair masks (at least 2 x B x m x m bool), and one layer's float64
    sums in the reducers (2 x H x m x m), times `CALIBRATION`."""
    pairs = batch * n_heads * length * length
    recorded = n_layers * pairs * element_bytes * (int(scores) + int(probs))
    running = 2 * pairs * element_bytes
    masks = 2 * batch * length * length
    reducer = 2 * n_heads * length * length * 8
    return int(CALIBRATION * (recorded + running + masks + reducer))


def attention_block_bytes(n_heads: int, batch: int, length: int, rows: int, element_bytes: int, hidden: int) -> int:
    """At least what one batch takes on the blockwise route (SPEC §19), linear in the length m: one layer's queries,
    keys, values and output (4 x B x m x hidden in the model's dtype, hidden = H x d_h), and one block of `rows`
    query rows (0: `recording.BLOCK_ELEMENTS` scores) against m keys: its scores and probabilities in the model's
    dtype plus six float64 temporaries of the reducers (B x H x rows x m each), and its masks (4 x B x rows x m
    bool); times `CALIBRATION`."""
    from posprobe.kernel.routes import BLOCK_ELEMENTS

    if rows <= 0:
        rows = max(1, BLOCK_ELEMENTS // max(1, batch * n_heads * length))
    rows = min(rows, length)
    block = batch * n_heads * rows * length
    per_layer = 4 * batch * length * hidden * element_bytes
    return int(CALIBRATION * (per_layer + block * (2 * element_bytes + 6 * 8) + 4 * batch * rows * length))


def check_fits(needed: int, device: Any, what: str, hint: str) -> None:
    """Refuse, in one line, work that needs more than the free memory of `device` (`what` says which)."""
    free = available_bytes(device)
    if free is not None and needed > free:
        raise PosprobeError(
            f"{what}: about {_size(needed)} needed (estimated from the shapes), {_size(free)} free", hint
        )


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 2**20:.1f} MiB"
