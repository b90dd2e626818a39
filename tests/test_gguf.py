"""GGUF checkpoints: header parsing against the gguf package's reader, every tensor against transformers'
`from_pretrained(..., gguf_file=...)`, resolution of files and folders, and analyses equal to the safetensors route.

The tiny files are written in code as llama.cpp converts models (tests/gguf_files.py), in F32, F16 and Q8_0.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from posprobe.checkpoint import resolve_model
from posprobe.checkpoint.gguf_format import read_gguf_header
from posprobe.checkpoint.gguf_weights import GGUFWeightReader, hf_name_map, meta_model
from posprobe.checkpoint.weights import open_weights
from posprobe.errors import PosprobeError

CASES = [("llama", "F32"), ("llama", "F16"), ("llama", "Q8_0"), ("qwen2", "F16"), ("gpt2", "Q8_0")]


def _from_pretrained(file):
    import transformers

    from posprobe.checkpoint.loading import quiet_libraries

    with quiet_libraries():
        return transformers.AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name).eval()


def _tied(model, key: str) -> bool:
    """True when parameter `key` shares its storage with another parameter (a tied output head)."""
    state = model.state_dict()
    return any(k != key and state[k].data_ptr() == state[key].data_ptr() for k in state)


@pytest.mark.parametrize("family, qtype", CASES, ids=[f"{f}-{q}" for f, q in CASES])
def test_every_tensor_equals_from_pretrained(family, qtype, tiny_ggufs):
    """Names, permutation of Q/K (Llama), transposes (GPT-2), de-quantisation: each tensor posprobe reads equals
    the parameter transformers loads from the same file, exactly; the only parameters it does not list are tied."""
    file = tiny_ggufs[family, qtype]
    source = resolve_model(file)
    reader = open_weights(source)
    assert isinstance(reader, GGUFWeightReader)
    model = _from_pretrained(file)
    state = model.state_dict()
    assert len(reader.keys()) == len(read_gguf_header(file).tensors)
    for key in reader.keys():
        expected = state[key].double().numpy()
        assert reader.shape(key) == expected.shape, key
        np.testing.assert_array_equal(reader.get(key), expected, err_msg=key)
    assert all(_tied(model, key) for key in set(state) - set(reader.keys()))


def test_the_llama_permutation_is_undone(tiny_ggufs):
    """The file stores Q/K rows permuted (llama.cpp), so reading them raw would differ; transformers' loader gives
    back the original model's Q/K exactly (F32), and so does posprobe."""
    from gguf_files import llama_cpp_permute

    original = tiny_ggufs["models"]["llama"].state_dict()
    reader = open_weights(resolve_model(tiny_ggufs["llama", "F32"]))
    header = read_gguf_header(tiny_ggufs["llama", "F32"])
    for layer in range(2):
        for proj, heads in (("q_proj", 4), ("k_proj", 2)):
            key = f"model.layers.{layer}.self_attn.{proj}.weight"
            stored = original[key].double().numpy()
            np.testing.assert_array_equal(reader.get(key), stored)
            assert not np.array_equal(llama_cpp_permute(stored, heads), stored)  # the permutation is not trivial
    assert set(header.tensors) >= {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}
    loaded = _from_pretrained(tiny_ggufs["llama", "F32"]).state_dict()
    for key, value in original.items():
        assert np.array_equal(loaded[key].numpy(), value.numpy()), key


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_name_map_equals_transformers(family, tiny_ggufs):
    """posprobe builds the GGUF -> transformers name map once (transformers rebuilds it per submodule); same map."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    file = next(v for k, v in tiny_ggufs.items() if k != "models" and k[0] == family)
    source, header = resolve_model(file), read_gguf_header(file)
    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=source.config)
    assert hf_name_map(header, source.config) == get_gguf_hf_weights_map(meta_model(source.config), processor)


@pytest.mark.parametrize("family, qtype", CASES[:3], ids=[f"{f}-{q}" for f, q in CASES[:3]])
def test_header_equals_the_gguf_reader(family, qtype, tiny_ggufs):
    _assert_header_matches(tiny_ggufs[family, qtype])


@pytest.mark.slow  # ~4 s: the whole SmolLM2 header, twice
@pytest.mark.integration
def test_header_of_smollm2_equals_the_gguf_reader(smollm2_gguf, smollm2_reader):
    header = _assert_header_matches(smollm2_gguf, smollm2_reader)
    assert header.architecture == "llama" and len(header.tensors) == 272


def _assert_header_matches(file, reference=None):
    import gguf

    header = read_gguf_header(file)
    reference = reference if reference is not None else gguf.GGUFReader(str(file))
    assert header.data_start == reference.data_offset and header.alignment == reference.alignment
    assert list(header.tensors) == [t.name for t in reference.tensors]
    for tensor in reference.tensors:
        info = header.tensors[tensor.name]
        assert (info.start, info.nbytes) == (tensor.data_offset, tensor.n_bytes)
        assert info.type_name == tensor.tensor_type.name
        assert info.shape == tuple(reversed(tensor.shape.tolist()))
    fields = {k: f.contents() for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert set(fields) == set(header.metadata)
    for key, value in fields.items():
        assert header.metadata[key] == (pytest.approx(value) if isinstance(value, float) else value)
    return header


def _transformers_raw_config(file) -> dict:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from posprobe.checkpoint.gguf_source import _quiet_transformers

    with _quiet_transformers():
        return load_gguf_checkpoint(str(file), return_tensors=False)["config"]


@pytest.mark.parametrize("family, qtype", CASES, ids=[f"{f}-{q}" for f, q in CASES])
def test_config_from_the_header_equals_transformers_gguf_loader(family, qtype, tiny_ggufs, tmp_path):
    """The config keys posprobe reads from its own parsed header (no second parse of the file by gguf's reader)
    equal those transformers' loader reads, key for key and type for type; a tied file says so; the architectures
    the loader special-cases go to the loader."""
    from gguf_files import rewrite_gguf

    from posprobe.checkpoint.gguf_source import raw_config_from_header

    file = tiny_ggufs[family, qtype]
    ours, theirs = raw_config_from_header(read_gguf_header(file)), _transformers_raw_config(file)
    assert ours == theirs and [type(ours[k]) for k in theirs] == [type(v) for v in theirs.values()]
    if family == "llama":
        import gguf

        name = {"general.name": ("mistral-7b-tiny", gguf.GGUFValueType.STRING)}
        renamed = rewrite_gguf(file, tmp_path / "m.gguf", set_fields=name)
        assert raw_config_from_header(read_gguf_header(renamed)) is None  # transformers renames it: ask it
        no_vocab = rewrite_gguf(file, tmp_path / "v.gguf", drop_fields=["llama.vocab_size"])
        ours, theirs = raw_config_from_header(read_gguf_header(no_vocab)), _transformers_raw_config(no_vocab)
        assert ours == theirs and ours.get("vocab_size") == theirs.get("vocab_size")  # the token list's length


@pytest.mark.slow  # ~3 s: transformers' GGUF loader
@pytest.mark.integration
def test_config_of_smollm2_from_the_header_equals_transformers_gguf_loader(smollm2_gguf):
    from posprobe.checkpoint.gguf_source import raw_config_from_header

    ours = raw_config_from_header(read_gguf_header(smollm2_gguf))
    assert ours == _transformers_raw_config(smollm2_gguf) and ours["tie_word_embeddings"] is True


@pytest.mark.slow  # ~11 s: two fresh processes
def test_a_second_command_reads_the_config_from_the_cache_without_torch(tiny_ggufs, tmp_path):
    """The GGUF config is kept between runs (keyed by the file and the library versions): a second process reads
    the same dict without importing transformers' config classes (and with them torch); a changed file is read
    again; an unwritable cache folder only costs time."""
    import json
    import os
    import subprocess
    import sys

    file = tmp_path / "m.gguf"
    shutil.copy(tiny_ggufs["llama", "Q8_0"], file)
    code = (
        "import json, sys; from posprobe.checkpoint import resolve_model; c = resolve_model(sys.argv[1]).config; "
        "print(json.dumps([c, 'torch' in sys.modules, 'transformers.configuration_utils' in sys.modules]))"
    )
    env = {
        **os.environ,
        "POSPROBE_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }

    def run():
        done = subprocess.run([sys.executable, "-c", code, str(file)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    built, torch_first, _ = run()
    assert torch_first and len(list((tmp_path / "cache" / "gguf-config").glob("*.json"))) == 1
    cached, torch_second, config_classes = run()
    assert cached == built and not torch_second and not config_classes
    os.utime(file, ns=(os.stat(file).st_atime_ns, os.stat(file).st_mtime_ns + 10**9))  # the file changed
    assert run()[1] and len(list((tmp_path / "cache" / "gguf-config").glob("*.json"))) == 2
    env["POSPROBE_CACHE_DIR"] = str(file)  # a file, not a folder: nothing can be written there
    assert run()[0] == built


def test_config_equals_autoconfig_from_the_file(tiny_ggufs):
    from transformers import AutoConfig

    file = tiny_ggufs["llama", "Q8_0"]
    source = resolve_model(file)
    expected = AutoConfig.from_pretrained(str(file.parent), gguf_file=file.name).to_dict()
    assert {k: v for k, v in source.config.items() if k != "_name_or_path"} == {
        k: v for k, v in expected.items() if k != "_name_or_path"
    }
    assert source.weight_format == "gguf" and source.path == file and source.gguf_file == file
    assert source.quantization == "Q8_0" and source.label == "tiny-llama.Q8_0"
    assert resolve_model(tiny_ggufs["llama", "F16"]).quantization == "F16"


def test_a_folder_with_one_gguf_file_is_that_file_and_with_two_asks_which(tiny_ggufs, tmp_path):
    file = tiny_ggufs["llama", "Q8_0"]
    source = resolve_model(file.parent)
    assert source.path == file and source.weight_format == "gguf" and source.label == file.parent.name
    folder = tmp_path / "two"
    folder.mkdir()
    shutil.copy(file, folder / "a.gguf")
    shutil.copy(tiny_ggufs["llama", "F16"], folder / "b.gguf")
    with pytest.raises(PosprobeError, match=r"holds 2 GGUF files \(a.gguf, b.gguf\); which one") as err:
        resolve_model(folder)
    assert "pass the file itself" in str(err.value) and "\n" not in str(err.value)


def test_row_mean_in_chunks_equals_the_mean_of_the_whole_table(tiny_ggufs):
    reader = open_weights(resolve_model(tiny_ggufs["llama", "Q8_0"]))
    key = reader.find_suffix("embed_tokens.weight")
    np.testing.assert_allclose(reader.row_mean(key, chunk_rows=7), reader.get(key).mean(axis=0), rtol=0, atol=1e-15)
    assert reader.quant_type(key) == "Q8_0" and reader.stored_dtype(key) == "F32"


@pytest.mark.parametrize("family, qtype", [("llama", "Q8_0"), ("qwen2", "F16")])
def test_content_free_profiles_equal_the_model_loaded_from_the_file(family, qtype, tiny_ggufs):
    """The analysis of the GGUF file equals the same analysis of the model transformers loads from it (whose
    tensors the family tests already check against its own attention)."""
    import posprobe

    file = tiny_ggufs[family, qtype]
    lazy = posprobe.profiles(file, layers="all", positions=24)
    loaded = posprobe.profiles(_from_pretrained(file), layers="all", positions=24)
    np.testing.assert_allclose(lazy.profiles, loaded.profiles, rtol=1e-12, atol=1e-12)
    assert lazy.causal and lazy.mode == "content-free"


def test_gpt2_gguf_table_analyses_equal_the_safetensors_route(tiny_ggufs, tmp_path):
    """A learned table read from a GGUF file (Q8_0) gives the analyses of that de-quantised model saved as
    safetensors."""
    from gguf_files import save_dequantized

    import posprobe

    file = tiny_ggufs["gpt2", "Q8_0"]
    save_dequantized(_from_pretrained(file), tmp_path / "st")
    for analysis in (posprobe.toeplitz, lambda m: posprobe.fhat(m, layer=1, mode="faithful")):
        gguf_result, st_result = analysis(file), analysis(tmp_path / "st")
        for name in ("matrix", "matrices"):
            if hasattr(gguf_result, name):
                np.testing.assert_allclose(getattr(gguf_result, name), getattr(st_result, name), rtol=1e-12)


def test_load_model_builds_a_gguf_file_as_transformers_does_and_quietly(tiny_ggufs, capfd):
    import torch
    import transformers

    import posprobe

    file = tiny_ggufs["llama", "Q8_0"]
    capfd.readouterr()
    model = posprobe.load_model(file, transformers.AutoModelForCausalLM)
    assert capfd.readouterr().err == ""  # transformers' de-quantising progress bar is silenced too
    reference = _from_pretrained(file).state_dict()
    assert set(model.state_dict()) == set(reference)
    assert all(torch.equal(value, reference[key]) for key, value in model.state_dict().items())
    assert type(posprobe.load_model(file.parent)).__name__ == "LlamaModel"  # the folder holding it, AutoModel


def test_load_model_and_retrofit_refuse_what_they_cannot_use(tiny_ggufs, tmp_path):
    import posprobe

    damaged = tmp_path / "cut.gguf"
    damaged.write_bytes(tiny_ggufs["llama", "Q8_0"].read_bytes()[:5000])
    with pytest.raises(PosprobeError, match="not a valid GGUF file") as err:
        posprobe.load_model(damaged)
    assert "\n" not in str(err.value)
    with pytest.raises(PosprobeError, match="cannot retrofit a 'llama' model"):
        posprobe.retrofit(tiny_ggufs["llama", "Q8_0"], "tisa")


def test_quantization_is_reported_in_json_and_figure_titles(tiny_ggufs, tiny_checkpoints, tmp_path, capsys):
    """What was analysed are de-quantised weights: every result says from which type (null for safetensors)."""
    import json

    import posprobe
    from posprobe.cli import main

    llama, gpt2 = tiny_ggufs["llama", "Q8_0"], tiny_ggufs["gpt2", "Q8_0"]
    note = "(Q8_0 GGUF, de-quantised)"
    toeplitz = posprobe.toeplitz(gpt2)
    assert toeplitz.to_dict()["quantization"] == "Q8_0" and note in toeplitz.plot().axes[0].get_title()
    fhat = posprobe.fhat(llama, positions=24)
    assert fhat.to_dict()["quantization"] == "Q8_0" and note in fhat.plot().title
    profiles = posprobe.profiles(llama, layers=[1], positions=24)
    assert profiles.to_dict()["quantization"] == "Q8_0" and note in profiles.plot()._suptitle.get_text()
    compare = posprobe.compare([llama, tiny_checkpoints["bert"]], positions=24)
    assert [row["quantization"] for row in compare.to_dict()["models"]] == ["Q8_0", None]
    assert note in compare.plot().axes[0].get_title()
    assert posprobe.profiles(tiny_checkpoints["bert"], layers=[0]).to_dict()["quantization"] is None
    for argv in (["params", str(llama)], ["profiles", str(llama), "--layers", "0", "--positions", "24"]):
        capsys.readouterr()
        try:
            main([*argv, "--json", *(["--out", str(tmp_path / argv[0])] if argv[0] != "params" else [])])
        except SystemExit as exit_info:
            assert exit_info.code in (0, None)
        assert json.loads(capsys.readouterr().out)["quantization"] == "Q8_0"


def test_quantization_is_reported_by_rotary_states_and_fit_tisa(tiny_ggufs):
    """The commands added beside the GGUF route say too that they analysed de-quantised weights (JSON and title)."""
    import posprobe

    llama = tiny_ggufs["llama", "Q8_0"]
    note = "(Q8_0 GGUF, de-quantised)"
    rotary = posprobe.rotary(llama, layers=[0], positions=24)
    assert rotary.to_dict()["quantization"] == "Q8_0" and note in rotary.plot()._suptitle.get_text()
    ids = [[5 + (t + i) % 20 for i in range(3 + t % 5)] for t in range(12)]
    states = posprobe.states(llama, input_ids=ids, min_texts=2)
    assert states.to_dict()["quantization"] == "Q8_0" and note in states.plot()._suptitle.get_text()
    fit = posprobe.fit_tisa(llama, kernels=1, window=4, layers=[0], positions=24)
    assert fit.to_dict()["quantization"] == "Q8_0" and any(note in t.get_text() for t in fit.plot().axes[0].texts)
    from posprobe.formats.tisa_kernels import kernels_metadata

    assert kernels_metadata(fit, fit.fits[0])["quantization"] == "Q8_0"


def test_arguments_are_refused_before_any_gguf_weight_is_opened(tiny_ggufs, tiny_checkpoints, tmp_path, monkeypatch,
                                                                capsys):  # fmt: skip
    """Issue 31: `fhat SmolLM2 --layer 99` spent ~6 s building transformers' GGUF name map (its loader and the model
    class imported) before refusing a layer the config already rules out. Every argument the config can check is
    refused with the name map and every tensor read made to fail: none of them is reached."""
    import posprobe
    from posprobe.checkpoint import gguf_weights
    from posprobe.cli import main
    from posprobe.runtime.phases import reporting_phases

    def opened(*args, **kwargs):
        raise AssertionError("the weights were opened")

    monkeypatch.setattr(gguf_weights, "hf_name_map", opened)
    monkeypatch.setattr(gguf_weights.GGUFWeightReader, "_dequantize", opened)
    file, out = tiny_ggufs["llama", "Q8_0"], tmp_path / "out"
    refusals = [
        (["fhat", file, "--layer", "99"], "layer 99 does not exist"),
        (["fhat", file, "--positions", "99999"], "99999 positions do not fit"),
        (["fhat", file, "--stack", "decoder"], "no decoder"),
        (["profiles", file, "--layers", "0,99"], "layer 99 does not exist"),
        (["profiles", file, "--layers", "0", "--positions", "24", "--window", "50"], "window 50 does not fit"),
        (["fit-tisa", file, "--layers", "99"], "layer 99 does not exist"),
        (["fit-tisa", file, "--layers", "0", "--positions", "24", "--window", "50"], "--window 50"),
        (["rotary", file, "--layers", "99"], "layer 99 does not exist"),
        (["compare", file, tiny_checkpoints["bert"], "--positions", "99999"], "99999 positions do not fit"),
        (["toeplitz", file], "no learned position table"),
        (["retrofit", file, "--mechanism", "fixed"], "cannot retrofit a 'llama' model"),
    ]
    said: list[str] = []
    for argv, words in refusals:
        try:
            with reporting_phases(said.append):
                main([str(a) for a in argv] + ["--out", str(out)])
            code = 0
        except SystemExit as exit_info:
            code = exit_info.code or 0
        captured = capsys.readouterr()
        assert code == 2 and words in captured.err and "opened" not in captured.err, (argv, code, captured.err)
        assert not out.exists()
    assert not [x for x in said if x.startswith("reading the weights")], said  # no phase line for what is not read
    with reporting_phases(said.append), pytest.raises(AssertionError, match="the weights were opened"):
        posprobe.fhat(file, layer=0, positions=24)  # a valid call reaches the patch, and says it reads the weights
    assert said[-1].startswith("reading the weights of ") and said[-1].endswith(file.name), said


def test_name_map_is_built_once_per_architecture_and_config_and_gives_the_same_names(tiny_ggufs, monkeypatch):
    """The GGUF -> transformers name map is cached in the process (`gguf_weights._NAME_MAPS`): a second reader of
    the same architecture and config (another quantisation of the same model) does not build it again, another
    architecture does, and the cached map is the one built anew."""
    from posprobe.checkpoint import gguf_weights

    built, build = [], gguf_weights._build_name_map
    monkeypatch.setattr(gguf_weights, "_NAME_MAPS", {})
    monkeypatch.setattr(gguf_weights, "_build_name_map", lambda h, c: built.append(h.architecture) or build(h, c))
    files = [tiny_ggufs["llama", q] for q in ("F32", "F16", "Q8_0")] + [tiny_ggufs["qwen2", "F16"]]
    for file in files + files:
        source = resolve_model(file)
        reader = GGUFWeightReader(file, source.config)
        assert reader.keys() == GGUFWeightReader(file, source.config)._names  # two readers, one map
        header = read_gguf_header(file)
        assert hf_name_map(header, source.config) == build(header, source.config)
    assert built == ["llama", "qwen2"]
    mapped = hf_name_map(read_gguf_header(files[0]), resolve_model(files[0]).config)
    mapped.clear()  # a caller's copy: the cache keeps its map
    assert hf_name_map(read_gguf_header(files[0]), resolve_model(files[0]).config)
