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
            "moss_transcribe_diarize", "emu3", "mllama", "gemma4", "gemma4_unified")  # fmt: skip
WRAPPERS += ("qwen4_exp",)  # issue 34 (qwen4)
# wrappers whose texts give no layer inputs, refused in one line: Mllama skips its cross-attention layers on text (no
# hidden state enters them); Qwen4-Exp's hidden states are several streams side by side (issue 34, qwen4)
TEXT_REFUSED = {"mllama": r"skips its layers \[1\] on text", "qwen4_exp": r"\(several streams per layer\)"}


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
