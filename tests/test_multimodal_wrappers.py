"""Issue 34: multimodal wrappers (Gemma 3, Qwen3.5, Fuyu, Emu3, Mllama, ...) are read as their language model (its
nested `text_config`, its tensors under its own module), never taking a vision or audio tower's tensors for it. The
parity of each wrapper's scores with its own module is checked with the other families (tests/test_family_scores.py,
tests/test_capture_families.py); here: the files a wrapper's `save_pretrained` writes, the wrapper loaded as its
task model (other module names) and its language model saved alone all read to the same scores, and the result says
what was read."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_models import build

import posprobe
from posprobe.checkpoint import WeightReader, resolve_model
from posprobe.errors import PosprobeError
from posprobe.families.context import ModelContext

WRAPPERS = ("gemma3", "qwen3_5", "qwen3_5_moe", "got_ocr2", "fuyu", "modernvbert", "ultravbert",
            "moss_transcribe_diarize", "emu3", "mllama", "gemma4", "gemma4_unified", "dots3_note")  # fmt: skip
WRAPPERS += ("llama4",)  # issue 34 (wrap): its text runs its language model alone (stack_to_run)
WRAPPERS += ("qwen4_exp",)  # issue 34 (qwen4)
# wrappers whose texts give no layer inputs, refused in one line: Mllama skips its cross-attention layers on text (no
# hidden state enters them); Qwen4-Exp's hidden states are several streams side by side (issue 34, qwen4); Dots3's
# indexers pick keys on the content-free input (SPEC §9)
TEXT_REFUSED = {"mllama": r"skips its layers \[1\] on text", "qwen4_exp": r"\(several streams per layer\)",
                "dots3_note": "on the content-free input only"}  # fmt: skip


def _language_model(model):
    """The wrapper's language model module (its own base model class, as transformers builds it)."""
    return model.language_model if hasattr(model, "language_model") else model.text_model


def _task_model(folder):
    """The checkpoint loaded as its task model (module names of their own: 'model.language_model.', ...)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    for auto in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModelForMaskedLM"):
        try:
            return getattr(transformers, auto).from_pretrained(folder, dtype=torch.float64).eval()
        except ValueError:  # no such task class for this config
            continue
    raise AssertionError(f"no task model for {config.model_type}")


@pytest.mark.slow
@pytest.mark.parametrize("name", WRAPPERS)
def test_a_wrapper_reads_as_its_language_model_alone(name, tmp_path):
    model = build(name)
    model.save_pretrained(tmp_path / "wrapper")
    text = type(_language_model(model))(model.config.get_text_config()).to(model.dtype).eval()
    text.load_state_dict(_language_model(model).state_dict())
    text.save_pretrained(tmp_path / "text")
    task = _task_model(tmp_path / "wrapper")
    results = {
        "files": posprobe.fhat(str(tmp_path / "wrapper"), layer=-1, positions=12),
        "loaded": posprobe.fhat(model, layer=-1, positions=12),
        f"task model {type(task).__name__}": posprobe.fhat(task, layer=-1, positions=12),
    }
    alone = posprobe.fhat(str(tmp_path / "text"), layer=-1, positions=12)
    assert np.std(alone.matrices) > 0
    for how, result in results.items():
        np.testing.assert_allclose(result.matrices, alone.matrices, rtol=1e-9, atol=1e-12, err_msg=how)
        assert result.model_type == name and alone.model_type == model.config.get_text_config().model_type
    assert results["files"].to_dict()["language_model"] == model.config.get_text_config().model_type
    assert "language_model" not in alone.to_dict()  # said only where a wrapper was read
    profiles = posprobe.profiles(str(tmp_path / "wrapper"), positions=12)
    assert (profiles.model_type, profiles.metadata()["language_model"]) == (name, alone.model_type)
    source = resolve_model(str(tmp_path / "wrapper"))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format))
    text_type = model.config.get_text_config().model_type
    assert (ctx.source.model_type, ctx.source.language_model) == (name, text_type)
    assert f"read as its language model, `{text_type}`" in ctx.family.mechanism
    last = ctx.layers() - 1  # an attention layer in every case (Qwen3.5's layer 0 is a linear-attention one)
    assert ctx.key(ctx.family.query + ".weight", last) in ctx.reader.keys()  # the language model's, not a tower's
    towers = ("vision", "audio", "vqmodel", "multi_modal_projector")  # every tensor beside the language model
    assert not any(part in key for key in ctx.reader.keys() for part in towers)


def test_a_wrapper_without_its_language_models_config_is_refused_in_one_line(tmp_path):
    build("gemma3").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    text = config.pop("text_config")
    for broken in (config, {**config, "text_config": {**text, "model_type": "llama"}}):
        (tmp_path / "config.json").write_text(json.dumps(broken))
        with pytest.raises(PosprobeError) as err:
            posprobe.fhat(str(tmp_path), layer=0, positions=8)
        assert "read" in str(err.value) and "'gemma3_text' language model" in str(err.value)
        assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe", "qwen4_exp"])
def test_mrope_gives_a_text_token_its_one_position_on_every_axis(name):
    """M-RoPE (Qwen3.5): each rotary frequency reads the temporal, height or width position (rope_parameters'
    mrope_section, interleaved). On text the wrapper gives its language model's rotary module the same position on
    every axis, so the rotation is 1-D RoPE at that position: what posprobe reads (the parity cases check the
    scores). A token whose axes differ (an image patch) is rotated otherwise, so the check can fail."""
    model = build(name)
    rotary = model.language_model.rotary_emb
    seen = []
    hook = rotary.register_forward_pre_hook(lambda module, args: seen.append(args[1].clone()))
    n = 10
    with torch.no_grad():
        model(input_ids=torch.arange(4, 4 + n)[None], use_cache=False)
    hook.remove()
    positions = seen[0].expand(3, -1, -1)  # (axes, batch, n), as the module reads it
    assert (positions == torch.arange(n)).all()
    x = torch.zeros(1, n, 1, dtype=torch.float64)
    cos_axes, sin_axes = rotary(x, positions)
    cos_one, sin_one = rotary(x, torch.arange(n)[None])
    torch.testing.assert_close(cos_axes, cos_one, rtol=0, atol=0)
    torch.testing.assert_close(sin_axes, sin_one, rtol=0, atol=0)
    image = positions.clone()
    image[1] += 3  # another height
    assert not torch.equal(rotary(x, image)[0], cos_one)


@pytest.mark.slow
@pytest.mark.parametrize("name", WRAPPERS)
def test_a_wrappers_data_conditioned_scores_are_its_language_models(name):
    """SPEC §13 on texts: the wrapper runs its language model on them, so its hidden states and data-conditioned
    scores are those of its language model alone; those of `TEXT_REFUSED` are refused in one line."""
    model = build(name)
    text = type(_language_model(model))(model.config.get_text_config()).to(model.dtype).eval()
    text.load_state_dict(_language_model(model).state_dict())
    texts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15]]
    if name in TEXT_REFUSED:
        with pytest.raises(PosprobeError, match=TEXT_REFUSED[name]) as err:
            posprobe.fhat(model, layer=-1, positions=8, input_ids=texts, input="mean")
        assert "\n" not in str(err.value)
        return
    ours = posprobe.fhat(model, layer=-1, positions=8, input_ids=texts, input="mean")
    alone = posprobe.fhat(text, layer=-1, positions=8, input_ids=texts, input="mean")
    assert ours.mode == "data-conditioned" and np.std(ours.matrices) > 0
    np.testing.assert_allclose(ours.matrices, alone.matrices, rtol=1e-6, atol=1e-9)


# issue 34 (wrap): wrappers that transformers cannot build or run on text, whose texts run their language model alone
def _profiles(model, texts):
    return posprobe.attention_profiles(model, input_ids=texts, max_length=12, batch_size=2, weights_correlation=False)


@pytest.mark.slow
def test_gemma3n_reads_and_runs_its_language_model_without_timm(tmp_path, monkeypatch):
    """Gemma 3n's vision tower is a timm model, which transformers builds only with timm installed (the test model
    leaves it out, `family_models.build`). Its checkpoint as transformers saves the wrapper (model.language_model.*
    beside an audio tower and the soft-token embedders) reads to the scores of its language model saved alone. On
    text the wrapper's own forward is its language model's on the same ids, so `attention` on the files builds the
    language model alone (timm is never imported) and records what the wrapper gives; its hidden states are stacks
    of AltUp streams, refused in one line as the language model's are."""
    import sys

    from safetensors import safe_open

    monkeypatch.setitem(sys.modules, "timm", None)  # importing timm fails, as where it is not installed
    model = build("gemma3n", torch.float32)
    model.save_pretrained(tmp_path / "wrapper")
    with safe_open(str(tmp_path / "wrapper" / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert "model.language_model.layers.0.self_attn.q_proj.weight" in names
    assert any(k.startswith("model.audio_tower.") for k in names) and "model.embed_vision.embedding.weight" in names
    text = model.model.language_model
    text.save_pretrained(tmp_path / "text")
    alone = posprobe.fhat(str(tmp_path / "text"), layer=-1, positions=12)
    ours = posprobe.fhat(str(tmp_path / "wrapper"), layer=-1, positions=12)
    np.testing.assert_array_equal(ours.matrices, alone.matrices)
    assert np.std(ours.matrices) > 0 and ours.model_type == "gemma3n"
    assert ours.to_dict()["language_model"] == "gemma3n_text"
    texts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15], [90, 91, 92, 93, 94, 95, 96, 97, 98]]
    with torch.no_grad():  # the wrapper's own forward (not posprobe's choice of module) on text
        for ids in texts:
            run = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
            own = text(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
            for theirs, mine in zip(run.attentions, own.attentions, strict=True):
                torch.testing.assert_close(theirs, mine, rtol=0, atol=0)
    loaded = posprobe.load_model(str(tmp_path / "wrapper"))
    assert type(loaded).__name__ == "Gemma3nTextModel"
    for key, value in text.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    on_files, in_memory = _profiles(str(tmp_path / "wrapper"), texts), _profiles(model, texts)
    reference = _profiles(text, texts)
    for result in (on_files, in_memory):
        for what in ("score_profiles", "prob_profiles", "mean_distance"):
            np.testing.assert_allclose(getattr(result.profiles, what), getattr(reference.profiles, what), rtol=1e-6,
                                       atol=1e-7, err_msg=what)  # fmt: skip
    with pytest.raises(PosprobeError, match="not \\(batch, tokens, width\\)") as err:
        posprobe.states(str(tmp_path / "wrapper"), input_ids=texts * 4, max_length=12)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_llama4_texts_run_its_language_model_alone(tmp_path):
    """transformers' Llama4ForConditionalGeneration.forward failed on text before 5.25, once its language model had
    run (it read image_outputs from the language model's output, which has none); on text that language model is run
    on the word
    embeddings of the ids, exactly its own run on them. So `attention`, `states` and `context` on the checkpoint (or
    the loaded wrapper) run the language model alone (Llama4ForCausalLM from text_config and the wrapper's
    language_model.* tensors) and give what the wrapper computed before it failed."""
    model = build("llama4")
    model.save_pretrained(tmp_path / "wrapper")
    texts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15], [90, 91, 92, 93, 94, 95, 96, 97, 98]]
    seen = []
    hook = model.language_model.register_forward_hook(lambda module, args, out: seen.append(out))
    try:  # before transformers 5.25 the wrapper fails here, after its language model ran; from 5.25 on it runs
        with torch.no_grad():
            model(input_ids=torch.tensor([texts[0]]), output_attentions=True, use_cache=False)
    except AttributeError as err:
        assert "image_outputs" in str(err)
    hook.remove()
    text = model.language_model
    with torch.no_grad():
        own = text(input_ids=torch.tensor([texts[0]]), output_attentions=True, use_cache=False)
    for theirs, mine in zip(seen[0].attentions, own.attentions, strict=True):
        torch.testing.assert_close(theirs, mine, rtol=0, atol=0)
    torch.testing.assert_close(seen[0].logits, own.logits, rtol=0, atol=0)
    loaded = posprobe.load_model(str(tmp_path / "wrapper"), dtype=torch.float64)
    assert type(loaded).__name__ == "Llama4TextModel"
    for key, value in text.model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    reference = _profiles(text, texts)
    for result in (_profiles(str(tmp_path / "wrapper"), texts), _profiles(model, texts)):
        for what in ("score_profiles", "prob_profiles", "mean_distance"):
            np.testing.assert_allclose(getattr(result.profiles, what), getattr(reference.profiles, what), rtol=1e-6,
                                       atol=1e-7, err_msg=what)  # fmt: skip
    runs = (str(tmp_path / "wrapper"), model, text)
    states = [posprobe.states(m, input_ids=texts * 4, max_length=12, min_texts=2) for m in runs]
    for result in states[:2]:
        np.testing.assert_allclose(result.vectors.norms, states[2].vectors.norms, rtol=1e-6, atol=1e-9)
    documents = [list(range(4, 40)), list(range(40, 80))]
    losses = [posprobe.context(m, [16], documents=documents, windows=2) for m in runs]
    for result in losses[:2]:
        np.testing.assert_allclose(result.perplexity, losses[2].perplexity, rtol=1e-6)
