"""Issue 34: multimodal wrappers (Gemma 3, Llama 4, Qwen3.5, Fuyu, ...) are read as their language model (its
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

WRAPPERS = ("gemma3",)


def _language_model(model):
    """The wrapper's language model module (its own base model class, as transformers builds it)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.language_model


@pytest.mark.slow
@pytest.mark.parametrize("name", WRAPPERS)
def test_a_wrapper_reads_as_its_language_model_alone(name, tmp_path):
    from transformers import AutoModel, AutoModelForCausalLM

    model = build(name)
    model.save_pretrained(tmp_path / "wrapper")
    text = AutoModel.from_config(model.config.get_text_config()).double().eval()
    text.load_state_dict(_language_model(model).state_dict())
    text.save_pretrained(tmp_path / "text")
    try:
        task = AutoModelForCausalLM.from_pretrained(tmp_path / "wrapper", dtype=torch.float64)
    except ValueError:  # a masked-LM wrapper
        from transformers import AutoModelForMaskedLM

        task = AutoModelForMaskedLM.from_pretrained(tmp_path / "wrapper", dtype=torch.float64)
    results = {
        "files": posprobe.fhat(str(tmp_path / "wrapper"), layer=-1, positions=12),
        "loaded": posprobe.fhat(model, layer=-1, positions=12),
        "task model": posprobe.fhat(task, layer=-1, positions=12),
    }
    alone = posprobe.fhat(str(tmp_path / "text"), layer=-1, positions=12)
    assert np.std(alone.matrices) > 0
    for how, result in results.items():
        np.testing.assert_allclose(result.matrices, alone.matrices, rtol=1e-9, atol=1e-12, err_msg=how)
        assert result.model_type == name and alone.model_type == model.config.get_text_config().model_type
    source = resolve_model(str(tmp_path / "wrapper"))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format))
    text_type = model.config.get_text_config().model_type
    assert (ctx.source.model_type, ctx.source.language_model) == (name, text_type)
    assert f"read as its language model, `{text_type}`" in ctx.family.mechanism
    assert ctx.key(ctx.family.query + ".weight", 0) in ctx.reader.keys()  # the language model's, not a tower's
    assert all(".vision" not in key and not key.startswith("vision") for key in ctx.reader.keys())


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
