"""Parse and check a GGUF header (llama.cpp's checkpoint format) before the gguf package or transformers read it.

Layout (little-endian, versions 2 and 3): magic `GGUF`, uint32 version, uint64 tensor count, uint64 metadata
count; the metadata pairs (string key, uint32 value type, value); the tensor infos (string name, uint32 n_dims,
n_dims uint64 sizes innermost first, uint32 ggml type, uint64 offset into the data section); padding up to
`general.alignment` (default 32); the data section. A string is a uint64 length and that many UTF-8 bytes; an
array a uint32 item type, a uint64 count and the items.

Every promise of the format is checked, so that a damaged or truncated file is one `PosprobeError` line and
never a numpy, struct or gguf exception: the magic and version; counts the rest of the file can hold; every
value type known, every string inside the file and valid UTF-8; keys and tensor names unique;
`general.architecture` a string; `general.alignment` a uint32 power of two; each tensor 1 to 4 dimensions
whose element count fits 63 bits, a ggml type the format defines (`gguf.constants.GGML_QUANT_SIZES`) whose block
divides its rows, an aligned offset, and its bytes inside the file without overlapping another tensor's.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posprobe.errors import PosprobeError

CORRUPT_HINT = "the file is damaged or incomplete; re-download or re-convert the GGUF file"
MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 (32-bit counts) predates every file transformers reads
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml tensors have at most 4 dimensions
MAX_NESTING = 4  # arrays of arrays (the format allows them; no known file nests deeper than 1)
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, value type, one-byte value
_MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one size, type, offset

# metadata value types of the format: code -> (name, struct format of a scalar, numpy dtype of an array of them)
STRING, ARRAY = 8, 9
_SCALARS = {
    0: ("UINT8", "<B", "<u1"),
    1: ("INT8", "<b", "<i1"),
    2: ("UINT16", "<H", "<u2"),
    3: ("INT16", "<h", "<i2"),
    4: ("UINT32", "<I", "<u4"),
    5: ("INT32", "<i", "<i4"),
    6: ("FLOAT32", "<f", "<f4"),
    7: ("BOOL", "<?", "?"),
    10: ("UINT64", "<Q", "<u8"),
    11: ("INT64", "<q", "<i8"),
    12: ("FLOAT64", "<d", "<f8"),
}
UINT32 = 4


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file: `shape` in numpy order (outermost first: the file's sizes reversed), its ggml
    type (`type_name`, e.g. 'Q4_1', 'F32'; `block_size` elements stored in `type_size` bytes), and its bytes
    `start`..`start + nbytes` (absolute offsets in the file)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    type_name: str
    block_size: int
    type_size: int
    start: int
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """A checked GGUF header: `metadata` {key: value} (strings, numbers, lists), `value_types` {key: type code},
    `tensors` {GGUF name: GGUFTensorInfo} in file order, the `alignment` and where the data section starts."""

    path: Path
    version: int
    metadata: dict
    value_types: dict
    tensors: dict
    alignment: int
    data_start: int
    size: int

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]


def shown(text: str, limit: int = 80) -> str:
    """A name read from a file, quoted for a one-line message: control characters and non-ASCII escaped, cut
    to `limit` characters."""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return ascii(text)


class _Invalid(Exception):
    """Internal: what is wrong with the header (turned into one PosprobeError naming the file)."""


def read_gguf_header(path) -> GGUFHeader:
    """The checked header of the GGUF file `path` (see the module docstring for what is checked)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size < 24:
            raise _Invalid(f"only {size} bytes, shorter than the 24-byte GGUF header")
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(data, path, size)
    except OSError as err:
        hint = "check the file and its permissions"
        raise PosprobeError(f"cannot read '{path}': {err.strerror or err}", hint) from err
    except _Invalid as err:
        raise PosprobeError(f"cannot read '{path}': not a valid GGUF file ({err})", CORRUPT_HINT) from err


def _known_types() -> dict[int, tuple[str, int, int]]:
    """ggml type code -> (name, block size, bytes per block): the format's own table, from the gguf package."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): (t.name, block, size) for t, (block, size) in GGML_QUANT_SIZES.items()}


class _Cursor:
    """Reads little-endian fields from `data` at `pos`, refusing to run past its end."""

    def __init__(self, data, size: int):
        self.data, self.size, self.pos = data, size, 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise _Invalid(f"{what} at byte {self.pos} runs past the end of the {self.size}-byte file")

    def scalar(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        length = self.scalar("<Q", what)
        self.need(length, what)
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _Invalid(f"{what} at byte {self.pos - length} is not UTF-8") from err


def _parse(data, path: Path, size: int) -> GGUFHeader:
    cur = _Cursor(data, size)
    magic = bytes(data[:4])
    if magic != MAGIC:
        raise _Invalid(f"it starts with {magic!r}, not the GGUF magic {MAGIC!r}")
    cur.pos = 4
    version = cur.scalar("<I", "the version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big") in (1, 2, 3)  # from a big-endian machine
        raise _Invalid("a big-endian file, which posprobe does not read" if swapped else f"version {version}, "
                       f"not one of {', '.join(map(str, VERSIONS))}")  # fmt: skip
    tensor_count = cur.scalar("<Q", "the tensor count")
    kv_count = cur.scalar("<Q", "the metadata count")
    if kv_count * _MIN_KV_BYTES > size - cur.pos:
        raise _Invalid(f"it claims {kv_count} metadata entries, more than its {size} bytes can hold")
    metadata, value_types = {}, {}
    for index in range(kv_count):
        key = cur.string(f"metadata key {index}")
        if key in metadata:
            raise _Invalid(f"metadata key {shown(key)} appears twice")
        value_type = cur.scalar("<I", f"the type of metadata {shown(key)}")
        metadata[key] = _value(cur, value_type, key, 0)
        value_types[key] = value_type
    if tensor_count * _MIN_TENSOR_BYTES > size - cur.pos:
        raise _Invalid(f"it claims {tensor_count} tensors, more than its {size} bytes can describe")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch or value_types["general.architecture"] != STRING:
        raise _Invalid("it has no general.architecture string")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and (
        value_types["general.alignment"] != UINT32 or alignment <= 0 or alignment & (alignment - 1)
    ):
        raise _Invalid(f"general.alignment {alignment!r} is not a uint32 power of two")
    types = _known_types()
    infos = [_tensor_info(cur, index, types) for index in range(tensor_count)]
    data_start = cur.pos + (-cur.pos) % alignment
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, shape, ggml_type, offset in infos:
        if name in tensors:
            raise _Invalid(f"tensor {shown(name)} appears twice")
        type_name, block, type_size = types[ggml_type]
        nbytes = math.prod(shape) // block * type_size
        if offset % alignment:
            raise _Invalid(f"tensor {shown(name)} starts at offset {offset}, not a multiple of the alignment "
                           f"{alignment}")  # fmt: skip
        start = data_start + offset
        if start + nbytes > size:
            raise _Invalid(
                f"tensor {shown(name)} ({type_name} {list(shape)}, {nbytes} bytes at byte {start}) runs past the "
                f"end of the {size}-byte file"
            )
        tensors[name] = GGUFTensorInfo(name, shape, ggml_type, type_name, block, type_size, start, nbytes)
    previous = None
    for info in sorted(tensors.values(), key=lambda t: (t.start, t.nbytes)):
        if previous is not None and info.start < previous.start + previous.nbytes:
            raise _Invalid(f"tensor {shown(info.name)} overlaps tensor {shown(previous.name)}")
        previous = info
    return GGUFHeader(path, version, metadata, value_types, tensors, alignment, data_start, size)


def _value(cur: _Cursor, value_type: int, key: str, depth: int):
    """One metadata value of type `value_type` (a scalar, a string or an array of them)."""
    if value_type in _SCALARS:
        return cur.scalar(_SCALARS[value_type][1], f"the value of metadata {shown(key)}")
    if value_type == STRING:
        return cur.string(f"the string of metadata {shown(key)}")
    if value_type != ARRAY:
        raise _Invalid(f"metadata {shown(key)} has unknown value type {value_type}")
    if depth >= MAX_NESTING:
        raise _Invalid(f"metadata {shown(key)} nests arrays more than {MAX_NESTING} deep")
    item_type = cur.scalar("<I", f"the item type of metadata {shown(key)}")
    count = cur.scalar("<Q", f"the length of metadata {shown(key)}")
    if item_type in _SCALARS:
        dtype = np.dtype(_SCALARS[item_type][2])
        cur.need(count * dtype.itemsize, f"the {count} values of metadata {shown(key)}")
        values = np.frombuffer(cur.data, dtype=dtype, count=count, offset=cur.pos).tolist()
        cur.pos += count * dtype.itemsize
        return values
    if item_type not in (STRING, ARRAY):
        raise _Invalid(f"metadata {shown(key)} is an array of unknown value type {item_type}")
    cur.need(count * (8 if item_type == STRING else 12), f"the {count} items of metadata {shown(key)}")
    if item_type == STRING:
        return [cur.string(f"item {i} of metadata {shown(key)}") for i in range(count)]
    return [_value(cur, ARRAY, key, depth + 1) for _ in range(count)]


def _tensor_info(cur: _Cursor, index: int, types: dict) -> tuple[str, tuple[int, ...], int, int]:
    """(name, numpy shape, ggml type, offset) of tensor info `index`, its sizes and type checked."""
    name = cur.string(f"the name of tensor {index}")
    n_dims = cur.scalar("<I", f"the dimension count of tensor {shown(name)}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Invalid(f"tensor {shown(name)} has {n_dims} dimensions, not 1 to {MAX_DIMS}")
    cur.need(8 * n_dims, f"the sizes of tensor {shown(name)}")
    dims = struct.unpack_from(f"<{n_dims}Q", cur.data, cur.pos)
    cur.pos += 8 * n_dims
    ggml_type = cur.scalar("<I", f"the type of tensor {shown(name)}")
    offset = cur.scalar("<Q", f"the offset of tensor {shown(name)}")
    count = 1
    for dim in dims:
        count *= dim
    if count >= 2**63:
        raise _Invalid(f"tensor {shown(name)} has sizes {list(dims)}, too large to address")
    if ggml_type not in types:
        raise _Invalid(f"tensor {shown(name)} has ggml type {ggml_type}, which the format does not define")
    type_name, block, _ = types[ggml_type]
    if dims[0] % block:
        raise _Invalid(f"tensor {shown(name)} has rows of {dims[0]} values, not whole {type_name} blocks of {block}")
    return name, tuple(reversed(dims)), ggml_type, offset
