"""Property-based tests of posprobe's own safetensors reader, in the manner of the format's maintainers.

A valid file (written by the `safetensors` library) is mutated: bytes flipped, the file truncated, the length
prefix replaced, header JSON fields replaced by values of the wrong type or range. For every mutant, posprobe
must either raise a clean `PosprobeError` or return exactly the tensors that the reference library
(`safetensors.torch.load`, which supports every dtype) returns for the same bytes. And a file the reference
library accepts is accepted by posprobe's header check too, so the two agree on validity.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posprobe.checkpoint.safetensors_format import read_header
from posprobe.checkpoint.weights import WeightReader
from posprobe.errors import PosprobeError

# A few seconds by default; POSPROBE_FUZZ_EXAMPLES=5000 for a deep run.
FUZZ = settings(
    max_examples=int(os.environ.get("POSPROBE_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _base_file() -> bytes:
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    tensors = {
        "embeddings.position_embeddings.weight": rng.standard_normal((6, 4)).astype(np.float32),
        "half": rng.standard_normal(5).astype(np.float16),
        "ints": np.arange(4, dtype=np.int32).reshape(2, 2),
        "scalar": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    return save(tensors, metadata={"format": "np"})


BASE = _base_file()


def _split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header, payload: bytes, pad: int = 0) -> bytes:
    raw = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(raw)) + raw + payload


def _reference(file: Path):
    """The safetensors library's reading of `file`: None if its header check refuses the file, else
    {name: float64 array, or None where torch cannot build or widen the tensor}."""
    from safetensors import safe_open

    try:
        handle = safe_open(str(file), framework="pt")
    except Exception:
        return None
    out = {}
    with handle:
        for name in handle.keys():
            try:
                out[name] = handle.get_tensor(name).double().numpy()
            except (RuntimeError, TypeError, ValueError, OverflowError):
                out[name] = None  # torch cannot hold or widen it: only a refusal by posprobe is acceptable
    return out


def check(data: bytes) -> None:
    """The property: a clean refusal or the reference library's tensors, and agreement on validity."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "model.safetensors").write_bytes(data)
        kind, result = _ours(folder)  # any exception other than PosprobeError fails the test here
        reference = _reference(folder / "model.safetensors")
    if kind == "refused":
        assert reference is None, f"posprobe refused a file the safetensors library reads: {result}"
        return
    assert reference is not None, f"posprobe accepted a file the safetensors library refuses: {sorted(result)}"
    assert sorted(result) == sorted(reference)
    for name, ours in result.items():
        if isinstance(ours, PosprobeError):
            continue
        expected = reference[name]
        assert expected is not None, f"posprobe decoded '{name}', which torch cannot"
        assert ours.dtype == np.float64 and ours.shape == expected.shape
        np.testing.assert_array_equal(ours, expected)


def _ours(folder: Path):
    """posprobe's reading: ("refused", error) or ("read", {name: array or PosprobeError})."""
    try:
        reader = WeightReader(folder)
    except PosprobeError as err:
        return "refused", err
    out = {}
    for name in reader.keys():
        try:
            out[name] = reader.get(name)
        except PosprobeError as err:  # e.g. NaN produced by a flipped byte, or an unreadable dtype
            out[name] = err
    return "read", out


def test_base_file_reads_exactly(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(BASE)
    kind, result = _ours(tmp_path)
    assert kind == "read" and all(isinstance(v, np.ndarray) for v in result.values())
    check(BASE)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(BASE) - 1), st.integers(1, 255)), min_size=1, max_size=4))
def test_flipped_bytes(flips):
    data = bytearray(BASE)
    for position, mask in flips:
        data[position] ^= mask
    check(bytes(data))


@pytest.mark.slow
@FUZZ
@given(st.integers(0, len(BASE) - 1))
def test_truncated(length):
    check(BASE[:length])


@pytest.mark.parametrize("shape", [[0, 2**60], [2**62, 0], [0, 2**64 - 1], [2**32, 2**32, 0], [0, 2**64]])
def test_empty_tensors_with_huge_dimensions(shape):
    """Found by the fuzzer: 0-element shapes beyond numpy's (or torch's) index range."""
    check(_join({"x": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}, b""))


@FUZZ
@given(st.integers(0, 2**64 - 1))
def test_length_prefix(length):
    check(struct.pack("<Q", length) + BASE[8:])


@FUZZ
@given(st.binary(max_size=16))
def test_appended_bytes(extra):
    check(BASE + extra)


_JUNK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["F32", "F16", "BF16", "F64", "I32", "U8", "F8_E4M3", "BOOL", "F4", "f32"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
_NAMES = sorted(_split(BASE)[0])


@FUZZ
@given(st.sampled_from(_NAMES), st.sampled_from(["dtype", "shape", "data_offsets", None]), _JUNK)
def test_header_field_replaced(name, field, value):
    header, payload = _split(BASE)
    if field is None:
        header[name] = value  # the whole entry (or __metadata__) replaced
    else:
        header[name][field] = value
    check(_join(header, payload))


@FUZZ
@given(
    st.sampled_from([n for n in _NAMES if n != "__metadata__"]),
    st.sampled_from(["shape", "data_offsets"]),
    st.integers(0, 1),
    st.integers(-(2**64), 2**64),
)
def test_header_number_replaced(name, field, index, number):
    header, payload = _split(BASE)
    values = header[name][field]
    if not values:
        values.append(number)
    else:
        values[min(index, len(values) - 1)] = number
    check(_join(header, payload))


@FUZZ
@given(_JUNK, st.integers(0, 8))
def test_header_replaced_whole(value, pad):
    check(_join(value, _split(BASE)[1], pad))


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda h: h["half"].update(data_offsets=[-8, 2]), "data_offsets"),
        (lambda h: h["ints"].update(shape=[-2, -2]), "shape"),
        (lambda h: h["half"].update(dtype="Q99"), "unknown dtype"),
        (lambda h: h.update(__metadata__={"format": 1}), "__metadata__"),
        (lambda h: h["half"].update(data_offsets=[0, 10]), "overlaps"),
    ],
)
def test_known_hostile_headers_are_refused(tmp_path, mutate, words):
    header, payload = _split(BASE)
    mutate(header)
    (tmp_path / "x.safetensors").write_bytes(_join(header, payload))
    with pytest.raises(PosprobeError, match=words):
        read_header(tmp_path / "x.safetensors")


def test_json_array_header_and_negative_offset_used_to_escape(tmp_path):
    """Regressions: an array header was `internal error`; a negative offset read header bytes as weights."""
    file = tmp_path / "x.safetensors"
    file.write_bytes(_join([1, 2], b""))
    with pytest.raises(PosprobeError, match="not a valid safetensors file"):
        read_header(file)
    header, payload = _split(BASE)
    entry = header["embeddings.position_embeddings.weight"]
    start, end = entry["data_offsets"]
    entry["data_offsets"] = [start - 16, end - 16]
    file.write_bytes(_join(header, payload))
    with pytest.raises(PosprobeError):
        read_header(file)
