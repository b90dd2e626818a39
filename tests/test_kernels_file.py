"""The kernels file (posprobe.formats.tisa_kernels): one validation for every reader, `--init` parsing, and
`check_settings`, the one check of a whole retrofit request (mechanism, radius, kernels, init)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.formats.tisa_kernels import InitSpec, load_tisa_kernels, parse_init, read_kernels_file, save_tisa_kernels
from posprobe.mechanisms import TisaOptions, check_settings


def write(path: Path, shape=(2, 4, 3), meta: dict | None = None, **overrides) -> Path:
    rng = np.random.default_rng(0)
    arrays = {
        "a": rng.normal(size=shape),
        "b": rng.uniform(0.1, 1, size=shape),
        "c": rng.normal(size=shape),
        "offset": rng.normal(size=shape[:2]),
    }
    arrays.update(overrides)
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items() if v is not None}
    meta = {"format": "posprobe-tisa-kernels", "layers": list(range(shape[0])), **(meta or {})}
    save_file(arrays, str(path), metadata={"posprobe": json.dumps(meta)})
    return path


def test_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(1)
    fit = SimpleNamespace(
        a=rng.normal(size=(3, 2, 5)), b=rng.normal(size=(3, 2, 5)), c=rng.normal(size=(3, 2, 5)), offset=np.ones((3, 2))
    )
    path = save_tisa_kernels(tmp_path / "k.safetensors", fit, {"layers": [0, 2, 5], "n_kernels": 5})
    kf = read_kernels_file(path)
    assert kf.layers == [0, 2, 5] and kf.n_kernels == 5 and kf.n_heads == 2
    np.testing.assert_array_equal(kf.a, fit.a.astype(np.float32))
    a, b, c, meta = load_tisa_kernels(path)  # the tuple form kept for pipelines.fitting's callers
    np.testing.assert_array_equal(c, fit.c.astype(np.float32)) and meta["offset"].shape == (3, 2)
    assert "KernelsFile(" in repr(kf) and "S=5" in repr(kf)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"shape": (2, 4, 0)}, "S = 0 is no kernel"),  # issue 14 §2: accepted by --init fit: before
        ({"shape": (0, 4, 3), "meta": {"layers": []}}, "at least 1"),
        ({"a": np.full((2, 4, 3), np.nan)}, "NaN/inf kernel"),
        ({"c": np.full((2, 4, 3), np.inf)}, "NaN/inf kernel"),
        ({"offset": np.full((2, 4), np.nan)}, "NaN/inf offsets"),
        ({"offset": np.zeros((2, 3))}, "offset of shape"),
        ({"b": np.zeros((2, 4, 2))}, "three equal (L, H, S) shapes"),
        ({"a": None}, "lacks the tensor(s) a"),
        ({"meta": {"layers": [0]}}, "lists 1 layers but holds 2"),
        ({"meta": {"layers": [0, -1]}}, "distinct layer numbers >= 0"),
        ({"meta": {"layers": [1, 1]}}, "distinct layer numbers >= 0"),
        ({"meta": {"layers": "0,1"}}, "distinct layer numbers >= 0"),
        ({"meta": {"n_kernels": 5}}, "n_kernels = 5 but its tensors have 3"),
        ({"meta": {"convention": "k = i - j"}}, "offset convention"),
        ({"meta": {"format": "other"}}, "has format"),
        ({"meta": {"version": 99}}, "format version"),
        ({"meta": {"shared_layers": "yes"}}, "shared_layers"),
    ],
)
def test_damaged_files_are_refused_everywhere(tmp_path, kwargs, fragment):
    path = write(tmp_path / "k.safetensors", **kwargs)
    for read in (read_kernels_file, load_tisa_kernels, lambda p: check_settings("tisa", init=f"fit:{p}")):
        with pytest.raises(PosprobeError) as info:
            read(path)
        assert fragment in str(info.value) and str(path) in str(info.value) and info.value.hint


def test_not_a_kernels_file(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    save_file({"a": np.zeros((1, 1, 1), np.float32)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(PosprobeError, match="does not exist"):
        read_kernels_file(tmp_path / "nope.safetensors")
    with pytest.raises(PosprobeError, match="no posprobe metadata"):
        read_kernels_file(tmp_path / "plain.safetensors")
    with pytest.raises(PosprobeError, match="cannot read"):
        read_kernels_file(tmp_path / "junk.safetensors")


def test_parse_init():
    assert parse_init("zero") == InitSpec("zero") and parse_init("fit") == InitSpec("fit")
    assert parse_init("fit:~/k.safetensors").path == Path("~/k.safetensors").expanduser()
    assert str(parse_init("fit:/x/k.safetensors")) == "fit:/x/k.safetensors"
    with pytest.raises(ArgumentValueError, match="unknown init 'gaussian'"):
        parse_init("gaussian")
    with pytest.raises(ArgumentValueError):
        parse_init("fit:")
    with pytest.raises(ArgumentTypeError, match="init must be a string"):
        parse_init(0)


def test_check_settings_defaults_and_the_files_S(tmp_path):
    plain = check_settings("fixed")
    assert (plain.mechanism, plain.radius, plain.init.kind, plain.kernels_file) == ("fixed", 8, "zero", None)
    tisa = check_settings("tisa", radius=3)
    assert tisa.options == TisaOptions(kernels=5, radius=3)
    path = write(tmp_path / "k.safetensors", shape=(2, 4, 3))
    fitted = check_settings("tisa", init=f"fit:{path}")
    assert fitted.kernels == 3 and fitted.kernels_file.n_kernels == 3  # S comes from the file
    assert check_settings("tisa", kernels=3, init=f"fit:{path}").kernels == 3  # the same S is fine


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"mechanism": "nope"}, ArgumentValueError, "unknown mechanism 'nope'"),
        ({"mechanism": 3}, ArgumentTypeError, "mechanism must be one of"),
        ({"radius": 0}, ArgumentValueError, "radius must be at least 1"),
        ({"radius": 4097}, ArgumentValueError, "radius must be at most 4096"),
        ({"radius": "8"}, ArgumentTypeError, "radius must be a whole number"),
        ({"radius": 2.0}, ArgumentTypeError, "radius must be a whole number"),
        ({"kernels": 0}, ArgumentValueError, "kernels must be at least 1"),
        ({"kernels": 257}, ArgumentValueError, "kernels must be at most 256"),
        ({"kernels": True}, ArgumentTypeError, "kernels must be a whole number"),
        ({"init": "fit", "mechanism": "fixed"}, ArgumentValueError, "only applies to TISA"),
        ({"kernels": 5, "init": "fit:FILE"}, ArgumentValueError, "kernels 5 differs from the S = 3"),
    ],
)
def test_check_settings_refuses(tmp_path, kwargs, error, fragment):
    path = write(tmp_path / "k.safetensors", shape=(2, 4, 3))
    kwargs = {"mechanism": "tisa", **kwargs}
    if kwargs.get("init") == "fit:FILE":
        kwargs["init"] = f"fit:{path}"
    with pytest.raises(error) as info:
        check_settings(kwargs.pop("mechanism"), **kwargs)
    assert fragment in str(info.value)
    assert "--" not in str(info.value).split(" — ")[0]  # library wording: argument names, not flags


def test_options_validate_on_construction():
    from posprobe.mechanisms import RadiusOptions

    with pytest.raises(ArgumentValueError, match="radius must be at least 1"):
        RadiusOptions(radius=0)
    with pytest.raises(ArgumentValueError, match="kernels must be at least 1"):
        TisaOptions(kernels=0)
