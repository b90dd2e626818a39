"""Damaged GGUF files: one `posprobe: error:` line, exit 2, nothing written, through the library and the CLI.

Each case copies a tiny GGUF file written as llama.cpp writes them (tests/gguf_files.py) and breaks one field of
its header at the byte where the gguf package's own reader finds it, as a failing disk, an interrupted download
or a hostile file would; the real SmolLM2 file is truncated at several sizes. A property test flips header bytes
at random: posprobe either refuses the file with a PosprobeError or reads the same tensors as the gguf package.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from gguf_files import byte_offsets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posprobe.checkpoint import resolve_model
from posprobe.checkpoint.gguf_format import read_gguf_header
from posprobe.cli import main
from posprobe.errors import PosprobeError


def _put(data: bytearray, at: int, fmt: str, value) -> None:
    data[at : at + struct.calcsize(fmt)] = struct.pack(fmt, value)


def _tensor(offsets, name="blk.0.attn_q.weight"):
    return offsets["tensors"][name]


def _duplicate_tensor(data, offsets):
    name_at = _tensor(offsets, "blk.1.attn_q.weight")["name"]
    data[name_at + 4] = ord("0")  # 'blk.1.attn_q.weight' -> 'blk.0.attn_q.weight'


def _overlap(data, offsets):
    first = struct.unpack_from("<Q", data, _tensor(offsets)["offset"])[0]
    _put(data, _tensor(offsets, "blk.0.attn_k.weight")["offset"], "<Q", first)


def _misaligned(data, offsets):
    at = _tensor(offsets)["offset"]
    _put(data, at, "<Q", struct.unpack_from("<Q", data, at)[0] + 1)


def _nan_norm(data, offsets):
    """A NaN in layer 0's attention norm (stored F32, read by every content-free analysis)."""
    offset_at = _tensor(offsets, "blk.0.attn_norm.weight")["offset"]
    start = offsets["data_start"] + struct.unpack_from("<Q", data, offset_at)[0]
    _put(data, start, "<f", float("nan"))


# (id, edit(data: bytearray, offsets)); every edit keeps the file's length unless it truncates
CASES = [
    ("zero-bytes", lambda d, o: d.clear()),
    ("truncated-in-the-magic", lambda d, o: d.__delitem__(slice(3, None))),
    ("truncated-in-the-metadata", lambda d, o: d.__delitem__(slice(o["kv"]["general.name"] + 5, None))),
    ("truncated-in-the-tensor-infos", lambda d, o: d.__delitem__(slice(_tensor(o)["dims"] + 3, None))),
    ("truncated-in-the-data", lambda d, o: d.__delitem__(slice(len(d) - 100, None))),
    ("wrong-magic", lambda d, o: d.__setitem__(slice(0, 4), b"GGML")),
    ("version-1", lambda d, o: _put(d, 4, "<I", 1)),
    ("version-4", lambda d, o: _put(d, 4, "<I", 4)),
    ("big-endian", lambda d, o: _put(d, 4, ">I", 3)),
    ("impossible-tensor-count", lambda d, o: _put(d, 8, "<Q", 2**40)),
    ("impossible-metadata-count", lambda d, o: _put(d, 16, "<Q", 2**40)),
    ("metadata-count-too-small", lambda d, o: _put(d, 16, "<Q", 3)),
    ("unknown-value-type", lambda d, o: _put(d, o["kv_type"]["general.name"], "<I", 77)),
    ("string-past-the-end", lambda d, o: _put(d, o["kv"]["general.name"], "<Q", 2**50)),
    ("key-not-utf8", lambda d, o: d.__setitem__(o["kv"]["general.name"] + 8, 0xFF)),
    ("no-architecture", lambda d, o: d.__setitem__(o["kv"]["general.architecture"] + 8 + 19, ord("f"))),
    ("unknown-architecture", lambda d, o: d.__setitem__(o["kv_type"]["general.architecture"] + 4 + 8 + 1, ord("x"))),
    ("tensor-offset-past-the-end", lambda d, o: _put(d, _tensor(o)["offset"], "<Q", 2**40)),
    ("tensor-offset-misaligned", _misaligned),
    ("overlapping-tensors", _overlap),
    ("unknown-quant-type", lambda d, o: _put(d, _tensor(o)["type"], "<I", 99)),
    ("zero-dimensions", lambda d, o: _put(d, _tensor(o)["n_dims"], "<I", 0)),
    ("five-dimensions", lambda d, o: _put(d, _tensor(o)["n_dims"], "<I", 5)),
    ("rows-not-whole-blocks", lambda d, o: _put(d, _tensor(o)["dims"], "<Q", 48)),
    ("huge-dimensions", lambda d, o: _put(d, _tensor(o)["dims"] + 8, "<Q", 2**62)),
    ("shape-disagrees-with-config", lambda d, o: _put(d, _tensor(o)["dims"] + 8, "<Q", 32)),
    ("duplicate-tensor-name", _duplicate_tensor),
    ("tensor-name-not-utf8", lambda d, o: d.__setitem__(_tensor(o)["name"], 0xFF)),
]


def _damaged(tiny_ggufs, tmp_path, edit, qtype="Q8_0"):
    source = tiny_ggufs["llama", qtype]
    data = bytearray(source.read_bytes())
    edit(data, byte_offsets(source))
    file = tmp_path / "damaged.gguf"
    file.write_bytes(bytes(data))
    return file


# the default run: one case of each part of the file (header, metadata, tensor infos, data); the slow tier (CI): all
QUICK = {"truncated-in-the-data", "wrong-magic", "version-4", "impossible-tensor-count", "unknown-value-type",
         "key-not-utf8", "unknown-architecture", "tensor-offset-past-the-end", "unknown-quant-type", "huge-dimensions",
         "shape-disagrees-with-config", "duplicate-tensor-name"}  # fmt: skip


@pytest.mark.parametrize(
    "name, edit",
    [pytest.param(*c, marks=() if c[0] in QUICK else pytest.mark.slow) for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_damaged_gguf_is_one_clean_line(name, edit, tiny_ggufs, tmp_path, capfd):
    file = _damaged(tiny_ggufs, tmp_path, edit)
    out = tmp_path / "out"
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["profiles", str(file), "--layers", "0", "--positions", "24", "--out", str(out)])
    captured = capfd.readouterr()
    lines = captured.err.strip().splitlines()
    assert exit_info.value.code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("posprobe: error:"), captured.err
    assert "internal error" not in lines[0] and "Traceback" not in captured.err and captured.out == ""
    assert not out.exists(), "a refused run wrote output"
    import posprobe

    with pytest.raises(PosprobeError) as err:  # the library refuses it the same way
        posprobe.profiles(file, layers=[0], positions=24)
    assert "\n" not in str(err.value)


def test_nan_in_a_tensor_is_refused(tiny_ggufs, tmp_path, capfd):
    file = _damaged(tiny_ggufs, tmp_path, _nan_norm, qtype="F32")
    with pytest.raises(SystemExit) as exit_info:
        main(["fhat", str(file), "--positions", "24", "--out", str(tmp_path / "out")])
    err = capfd.readouterr().err
    assert exit_info.value.code == 2 and "NaN or infinite" in err and "blk.0.attn_norm" not in err
    assert "model.layers.0.input_layernorm.weight" in err and not (tmp_path / "out").exists()


def test_the_check_before_fine_tuning_reads_every_gguf_tensor(tiny_ggufs, tmp_path):
    """`finetune` checks every tensor before it builds the model: a GGUF file's too, de-quantised one at a time."""
    from posprobe.checkpoint.weights import check_finite_weights

    check_finite_weights(resolve_model(tiny_ggufs["llama", "F32"]))
    with pytest.raises(PosprobeError, match="input_layernorm.weight.*NaN or infinite"):
        check_finite_weights(resolve_model(_damaged(tiny_ggufs, tmp_path, _nan_norm, qtype="F32")))


def test_messages_say_what_is_wrong(tiny_ggufs, tmp_path):
    expected = {
        "wrong-magic": "not the GGUF magic",
        "big-endian": "big-endian",
        "impossible-tensor-count": "claims 1099511627776 tensors",
        "tensor-offset-past-the-end": "runs past the end",
        "tensor-offset-misaligned": "not a multiple of the alignment 32",
        "overlapping-tensors": "overlaps tensor",
        "unknown-quant-type": "ggml type 99, which the format does not define",
        "rows-not-whole-blocks": "not whole Q8_0 blocks of 32",
        "duplicate-tensor-name": "appears twice",
        "unknown-architecture": "architecture 'lxama', which transformers cannot load",
    }
    cases = dict(CASES)
    for name, words in expected.items():
        with pytest.raises(PosprobeError, match=words):
            resolve_model(_damaged(tiny_ggufs, tmp_path, cases[name]))


@pytest.fixture(scope="module")
def smollm2_offsets(smollm2_gguf, smollm2_reader):
    return byte_offsets(smollm2_gguf, smollm2_reader)


@pytest.mark.slow  # gguf's own reader parses the real file's 98k tokenizer strings first (smollm2_offsets)
@pytest.mark.integration
@pytest.mark.parametrize("cut", ["start", "metadata", "tensor-infos", "data-start", "half", "last-byte"])
def test_truncated_smollm2_is_refused(cut, smollm2_gguf, smollm2_offsets, tmp_path):
    """A copy of the real file cut where an interrupted download would leave it."""
    offsets = smollm2_offsets
    size = os.path.getsize(smollm2_gguf)
    keep = {
        "start": 20,
        "metadata": offsets["kv"]["tokenizer.ggml.merges"] + 1000,
        "tensor-infos": offsets["tensors"]["blk.7.attn_q.weight"]["dims"],
        "data-start": offsets["data_start"] + 10,
        "half": size // 2,
        "last-byte": size - 1,
    }[cut]
    file = tmp_path / "SmolLM2.gguf"
    with open(smollm2_gguf, "rb") as src, open(file, "wb") as dst:
        dst.write(src.read(keep))
    with pytest.raises(PosprobeError, match="not a valid GGUF file") as err:
        read_gguf_header(file)
    expected = "only 20 bytes" if cut == "start" else f"runs past the end of the {keep}-byte file"
    assert expected in str(err.value)


# -- property test: random header bytes --------------------------------------------------------------------------
FUZZ = settings(
    max_examples=int(os.environ.get("POSPROBE_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


_HEADER_END: dict = {}


@FUZZ
@given(data=st.data())
def test_flipped_header_bytes_are_refused_or_read_as_the_gguf_package_reads_them(data, tiny_ggufs, tmp_path):
    import gguf

    source = tiny_ggufs["llama", "Q8_0"]
    raw = bytearray(source.read_bytes())
    header_end = _HEADER_END.setdefault(source, byte_offsets(source)["data_start"])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, header_end - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(0, len(raw))) :]
    file = tmp_path / "fuzz.gguf"
    file.write_bytes(bytes(raw))
    try:
        header = read_gguf_header(file)
    except PosprobeError as err:
        assert "\n" not in str(err)
        return
    reference = gguf.GGUFReader(str(file))  # whatever posprobe accepts, the format's own reader reads alike
    assert header.data_start == reference.data_offset
    assert [(t.name, t.start, t.nbytes, t.type_name) for t in header.tensors.values()] == [
        (t.name, t.data_offset, t.n_bytes, t.tensor_type.name) for t in reference.tensors
    ]
    for tensor in reference.tensors:
        assert np.asarray(tensor.data).nbytes == header.tensors[tensor.name].nbytes
