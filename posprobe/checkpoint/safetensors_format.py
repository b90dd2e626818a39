"""Parse and check a safetensors header the way the `safetensors` library does, without torch.

Layout: 8-byte little-endian header length n, n bytes of UTF-8 JSON, then the data section. The JSON is an
object mapping tensor names to `{"dtype": str, "shape": [int >= 0, ...], "data_offsets": [start, end]}`
(offsets relative to the data section) plus an optional `"__metadata__"` str -> str map. Every promise of the
format is checked: the header fits in the file and starts with '{'; each entry has a known dtype, a shape of
non-negative ints and `end - start == prod(shape) * itemsize`; the tensors tile the data section exactly
(sorted by offset, each starts where the previous ended, the last ends at the end of the file), so no two
overlap and none lies outside the data. Anything else is a `PosprobeError`, never another exception.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from posprobe.errors import PosprobeError

CORRUPT_HINT = "the file is damaged or incomplete; re-download or re-save the checkpoint"
MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's limit
_USIZE = 2**64
# Bytes per element of every dtype the format defines with a whole number of bytes (sub-byte types are refused).
ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: `start`/`end` are absolute byte offsets in `file`."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class _Invalid(Exception):
    """Internal: what is wrong with the header (turned into one PosprobeError naming the file)."""


def read_header(path: Path) -> dict[str, TensorEntry]:
    """`{name: TensorEntry}` of the safetensors file `path`, every format promise checked."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise _Invalid(f"only {size} bytes, shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER:
                raise _Invalid(f"header length {length} exceeds the format's limit of {MAX_HEADER}")
            if 8 + length > size:
                raise _Invalid(f"header length {length} runs past the end of the {size}-byte file")
            raw = fh.read(length)
    except OSError as err:
        hint = "check the file and its permissions"
        raise PosprobeError(f"cannot read '{path}': {err.strerror or err}", hint) from err
    except _Invalid as err:
        raise PosprobeError(f"cannot read '{path}': not a valid safetensors file ({err})", CORRUPT_HINT) from err
    try:
        return parse_header(raw, size - 8 - length, path)
    except _Invalid as err:
        raise PosprobeError(f"cannot read '{path}': not a valid safetensors file ({err})", CORRUPT_HINT) from err


def parse_header(raw: bytes, data_size: int, path: Path) -> dict[str, TensorEntry]:
    """Check header bytes `raw` against a data section of `data_size` bytes; raises `_Invalid`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _Invalid("header is not UTF-8") from err
    if not text.startswith("{"):
        raise _Invalid("header does not start with '{'")
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise _Invalid("header is not valid JSON") from err
    if not isinstance(header, dict):
        raise _Invalid("header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise _Invalid("__metadata__ is not a map of strings to strings")
    data_start = 8 + len(raw)
    spans = []
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        dtype, shape, start, end = _entry(name, info)
        nbytes = _nbytes(name, dtype, shape)
        if end - start != nbytes:
            raise _Invalid(f"tensor '{name}' spans {end - start} bytes, but {dtype} {list(shape)} needs {nbytes}")
        spans.append((start, end, name))
        entries[name] = TensorEntry(path, dtype, shape, data_start + start, data_start + end)
    position = 0
    for start, end, name in sorted(spans):
        if start != position:
            what = "overlaps another tensor" if start < position else "leaves a gap before it"
            raise _Invalid(f"tensor '{name}' {what} (offset {start}, expected {position})")
        position = end
    if position != data_size:
        raise _Invalid(f"the tensors cover {position} bytes but the data section holds {data_size}")
    return entries


def _entry(name: str, info) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(info, dict):
        raise _Invalid(f"entry '{name}' is not a JSON object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise _Invalid(f"tensor '{name}' has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_natural(s) for s in shape):
        raise _Invalid(f"tensor '{name}' has shape {shape!r}, not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
        raise _Invalid(f"tensor '{name}' has data_offsets {offsets!r}, not two non-negative integers")
    start, end = offsets
    if end < start:
        raise _Invalid(f"tensor '{name}' ends (offset {end}) before it starts ({start})")
    return dtype, tuple(shape), start, end


def _nbytes(name: str, dtype: str, shape: tuple[int, ...]) -> int:
    """Byte size of a tensor, refusing what overflows 64-bit arithmetic (as the Rust library does, left to right)."""
    count = 1
    for size in shape:
        count *= size
        if count >= _USIZE:
            raise _Invalid(f"tensor '{name}' has shape {list(shape)}, too large to address")
    if count * ITEMSIZE[dtype] * 8 >= _USIZE:
        raise _Invalid(f"tensor '{name}' has shape {list(shape)}, too large to address")
    return count * ITEMSIZE[dtype]


def _natural(value) -> bool:
    """A JSON integer that fits the format's unsigned 64-bit fields."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _USIZE
