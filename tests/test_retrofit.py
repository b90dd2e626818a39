"""retrofit(): TISA kernels from a file, parameter counts (SPEC §8), depth tracking in ALBERT, position-table
dropping, loading plain/retrofitted checkpoints into other classes, and the errors users can hit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_tiny
from safetensors.numpy import save_file

from posprobe.errors import PosprobeError, PosprobeWarning
from posprobe.retrofitting.install import added_parameters, depth_slots, mechanism_at, retrofit, save_retrofitted
from posprobe.retrofitting.loading import load_model

H, L, D = 4, 2, 32  # tiny models: 4 heads, 2 layers, hidden 32 -> d_h = 8


def _save_kernels(path, a, b, c, **meta):
    """A kernels file in the `posprobe fit-tisa` format: float32 (L, H, S) tensors + JSON metadata."""
    meta = {"layers": list(range(a.shape[0])), "convention": "k = j - i", **meta}
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in dict(a=a, b=b, c=c).items()}
    save_file(arrays, str(path), metadata={"posprobe": json.dumps(meta)})
    return tuple(arrays[k].astype(np.float64) for k in "abc")


def _kernels_file(path, layers=L, heads=H, s=3, seed=0, **meta):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(layers, heads, s))
    b = rng.uniform(0.05, 1.0, size=(layers, heads, s))
    c = rng.uniform(-5, 5, size=(layers, heads, s))
    return _save_kernels(path, a, b, c, **meta)


def _bias(model, depth, n):
    q = torch.zeros(1, H, n, D // H, dtype=torch.float64)
    return mechanism_at(model, depth).score_bias(q, q)[0].detach()


def test_tisa_from_file_reproduces_f_of_j_minus_i(tmp_path):
    a, b, c = _kernels_file(tmp_path / "k.safetensors")
    model = retrofit(build_tiny("bert").double(), "tisa", init=f"fit:{tmp_path / 'k.safetensors'}")
    assert model.config.posprobe["kernels"] == 3
    n = 11
    for depth in range(L):
        bias = _bias(model, depth, n).numpy()
        for h in range(H):
            for i in range(n):
                for j in range(n):
                    k = j - i
                    f = np.sum(a[depth, h] * np.exp(-np.abs(b[depth, h]) * (k - c[depth, h]) ** 2))
                    assert bias[h, i, j] == pytest.approx(f, rel=1e-12, abs=1e-12)


def test_tisa_orientation_positive_centre_looks_right(tmp_path):
    a = np.zeros((L, H, 1)) + 1.0
    b = np.zeros((L, H, 1)) + 2.0
    c = np.zeros((L, H, 1)) + 3.0  # c > 0: query i favours key j = i + 3
    _save_kernels(tmp_path / "k.safetensors", a, b, c)
    model = retrofit(build_tiny("bert").double(), "tisa", init=f"fit:{tmp_path / 'k.safetensors'}")
    bias = _bias(model, 0, 10)
    assert bias[0].argmax(dim=-1)[:7].tolist() == [i + 3 for i in range(7)]


def test_tisa_kernels_layer_mismatch(tmp_path):
    _kernels_file(tmp_path / "k.safetensors", layers=3)
    with pytest.raises(PosprobeError, match="2 layers"):
        retrofit(build_tiny("bert"), "tisa", init=f"fit:{tmp_path / 'k.safetensors'}")
    _kernels_file(tmp_path / "h.safetensors", heads=3)
    model = build_tiny("bert")
    with pytest.raises(PosprobeError, match="3 heads"):
        retrofit(model, "tisa", init=f"fit:{tmp_path / 'h.safetensors'}")
    assert added_parameters(model) == 0 and model.config._attn_implementation != "posprobe"  # left untouched


def test_tisa_kernels_for_some_layers_and_shared_albert(tmp_path):
    a, b, c = _kernels_file(tmp_path / "k.safetensors", layers=1)
    with pytest.warns(PosprobeWarning, match=r"layers \[1\] start at zero"):
        bert = retrofit(build_tiny("bert").double(), "tisa", init=f"fit:{tmp_path / 'k.safetensors'}")
    assert torch.equal(mechanism_at(bert, 0).a.detach(), torch.from_numpy(a[0]))
    assert mechanism_at(bert, 1).a.abs().sum() == 0  # not fitted: zero amplitude
    albert = retrofit(
        build_tiny("albert", num_hidden_layers=3).double(), "tisa", init=f"fit:{tmp_path / 'k.safetensors'}"
    )
    for depth in range(3):  # one fitted (shared) layer initialises every depth
        assert torch.equal(mechanism_at(albert, depth).c.detach(), torch.from_numpy(c[0]))


@pytest.mark.parametrize("family, layers", [("bert", L), ("albert", 3)])
def test_parameter_counts_follow_spec(family, layers):
    overrides = {"num_hidden_layers": layers} if family == "albert" else {}
    r, s, dh = 8, 5, D // H
    expected = {
        "tisa": 3 * s * H * layers,
        "fixed": H * (2 * r + 1) * layers,
        "dynamic": (2 * r + 1) * dh * layers,
        "composite": (H + dh) * (2 * r + 1) * layers,
    }
    for name, count in expected.items():
        model = retrofit(build_tiny(family, **overrides), name, radius=r, kernels=s)
        assert added_parameters(model) == count, name
    assert added_parameters(build_tiny(family)) == 0


def test_albert_keeps_one_mechanism_per_depth():
    model = retrofit(build_tiny("albert", num_hidden_layers=3), "fixed", init="random")
    slots = depth_slots(model)
    assert [s for _, s in slots] == [0, 1, 2] and len({id(m) for m, _ in slots}) == 1
    attention = slots[0][0]
    used = []
    attention.register_forward_hook(lambda mod, args, out: used.append(mod._posprobe_slot))
    ids = torch.randint(5, 99, (1, 8))
    with torch.no_grad():
        first = model(ids)[0]
        second = model(ids)[0]
        assert used == [0, 1, 2, 0, 1, 2]
        assert torch.equal(first, second)
        mechanism_at(model, 2).beta.add_(5 * torch.randn(4, 17))  # only the last depth changes
        assert (model(ids)[0] - first).abs().max() > 1e-4


def test_albert_groups_and_inner_layers_follow_the_family_table():
    """depth_slots reads ALBERT's layer groups from the family table (`Family.layer_groups`), not from attribute
    names in code: with 2 groups of 2 inner layers over 4 depths, its slots are the attention modules in the order
    the model really calls them (recorded by forward hooks on an unretrofitted copy), each numbered by its call."""
    model = build_tiny("albert", num_hidden_layers=4, num_hidden_groups=2, inner_group_num=2)
    called = []
    for name, module in model.named_modules():
        if name.endswith(".attention"):
            module.register_forward_hook(lambda mod, args, out: called.append(mod))
    with torch.no_grad():
        model(torch.randint(5, 99, (1, 6)))
    assert len(called) == 8 and len({id(m) for m in called}) == 4
    slots = depth_slots(model)
    assert [id(m) for m, _ in slots] == [id(m) for m in called]
    assert [s for _, s in slots] == [[id(x) for x in called[:i]].count(id(m)) for i, m in enumerate(called)]
    retrofit(model, "fixed", init="random")
    assert added_parameters(model) == 8 * H * 17  # one mechanism per call: 4 depths x 2 inner layers


def test_drop_position_embeddings_averages_and_freezes():
    model = build_tiny("roberta")
    table = model.embeddings.position_embeddings.weight
    reserved = model.config.pad_token_id + 1
    mean = table[reserved:].detach().mean(0).clone()
    retrofit(model, "tisa", drop_position_embeddings=True)
    assert torch.allclose(table, mean.expand_as(table))
    assert not table.requires_grad
    n = 2 * model.config.max_position_embeddings
    with torch.no_grad():
        out = model(torch.randint(5, 99, (1, n)))[0]
    assert out.shape[1] == n


def test_replace_mode_equals_mean_embedding_model():
    """TISA replace at zero init equals the original model fed the average position embedding."""
    base = build_tiny("bert").double()
    ids = torch.randint(5, 99, (2, 9))
    table = base.embeddings.position_embeddings.weight
    mean = table.detach().mean(0)
    with torch.no_grad():
        embeds = base.embeddings.word_embeddings(ids)
        ref = base(inputs_embeds=embeds + (mean - table[:9])[None])[0]  # cancel each row, add the mean
        retrofit(base, "tisa", drop_position_embeddings=True)
        out = base(input_ids=ids)[0]
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_eager_models_and_attention_outputs():
    base = build_tiny("bert").double()
    base.set_attn_implementation("eager")
    ids = torch.randint(5, 99, (2, 7))
    with torch.no_grad():
        ref = base(ids, output_attentions=True)
        retrofit(base, "composite")
        new = base(ids, output_attentions=True)
    torch.testing.assert_close(new[0], ref[0], rtol=0, atol=1e-12)
    for a, b in zip(new.attentions, ref.attentions):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["tisa", "composite", "key-dynamic", "shaw-values", "depthwise"])
def test_sdpa_and_explicit_paths_agree(name, monkeypatch):
    import posprobe.retrofitting.attention as rf

    model = retrofit(build_tiny("bert").double(), name, radius=3, init="random")
    ids = torch.randint(5, 99, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    explicit = model(ids, attention_mask=mask)[0]
    monkeypatch.setattr(rf, "EXPLICIT_ON_CPU", False)
    fused = model(ids, attention_mask=mask)[0]
    keep = mask.bool()
    torch.testing.assert_close(fused[keep], explicit[keep], rtol=1e-10, atol=1e-10)
    grads = [
        torch.autograd.grad(out[keep].pow(2).sum(), list(model.parameters()), allow_unused=True)
        for out in (explicit, fused)
    ]
    for a, b in zip(*grads):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_training_step_updates_mechanism():
    model = retrofit(build_tiny("electra"), "composite", init="zero").train()
    ids = torch.randint(5, 99, (2, 12))
    model(ids)[0].pow(2).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if "posprobe_mechanisms" in n]
    assert grads and all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_load_plain_and_into_task_class(tmp_path):
    from transformers import AutoModelForSequenceClassification

    plain = build_tiny("bert")
    plain.save_pretrained(tmp_path / "plain")
    ids = torch.randint(5, 99, (2, 7))
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path / "plain").eval()(ids)[0], plain(ids)[0])
    model = retrofit(build_tiny("bert"), "dynamic", init="random")
    save_retrofitted(model, tmp_path / "fitted")
    clf = load_model(tmp_path / "fitted", AutoModelForSequenceClassification, num_labels=3).eval()
    assert clf.config.posprobe["mechanism"] == "dynamic" and added_parameters(clf) == added_parameters(model)
    with torch.no_grad():
        assert torch.equal(clf.bert(ids)[0], model(ids)[0])
        assert clf(ids).logits.shape == (2, 3)


@pytest.mark.parametrize("family", ["gpt2", "distilbert"])
def test_unsupported_architecture(family):
    with pytest.raises(PosprobeError, match="cannot retrofit"):
        retrofit(build_tiny(family), "tisa")


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"mechanism": "nope"}, "unknown mechanism"),
        ({"mechanism": "fixed", "init": "fit:/no/such/file"}, "only applies to TISA"),
        ({"mechanism": "tisa", "init": "fit:/no/such/file"}, "does not exist"),
        ({"mechanism": "tisa", "init": "gaussian"}, "unknown init 'gaussian'"),
        ({"mechanism": "fixed", "radius": 0}, "radius must be at least 1"),
        ({"mechanism": "fixed", "radius": 5000}, "radius must be at most 4096"),
        ({"mechanism": "tisa", "kernels": 0}, "kernels must be at least 1"),
        ({"mechanism": "tisa", "radius": "8"}, "radius must be a whole number"),
        ({"mechanism": "tisa", "init": "fit"}, "needs a kernels file"),
        ({"mechanism": "tisa", "seed": -1}, "seed must be at least 0"),
        ({"mechanism": "tisa", "drop_position_embeddings": "yes"}, "drop_position_embeddings must be True or False"),
    ],
)
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(PosprobeError, match=pattern):
        retrofit(build_tiny("bert"), **kwargs)


def test_retrofit_twice_is_refused():
    model = retrofit(build_tiny("bert"), "fixed")
    with pytest.raises(PosprobeError, match="already retrofitted"):
        retrofit(model, "tisa")


@pytest.mark.integration
@pytest.mark.parametrize("name", ["composite", "cat"])
def test_packaged_minilm_zero_init_parity(name):
    model = load_model(None).eval()
    ids = torch.randint(1000, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    with torch.no_grad():
        ref = model(ids, attention_mask=mask)[0]
        retrofit(model, name)
        new = model(ids, attention_mask=mask)[0]
    keep = mask.bool()
    torch.testing.assert_close(new[keep], ref[keep], rtol=1e-5, atol=1e-5)
    assert added_parameters(model) == {"composite": 6 * 17 * (12 + 32), "cat": 6 * 3 * 384 * 17}[name]


@pytest.mark.parametrize("name", ["cat", "composite"])
def test_gradient_checkpointing_gives_the_same_gradients(name):
    grads = []
    for checkpointing in (False, True):
        model = retrofit(
            build_tiny("bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).double(),
            name,
            radius=2,
            init="random",
        )
        if checkpointing:
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        model.train()
        ids = torch.randint(5, 99, (2, 8), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        mask[1, 5:] = 0
        model(ids, attention_mask=mask)[0][mask.bool()].pow(2).sum().backward()
        grads.append([p.grad for n, p in model.named_parameters() if "posprobe_mechanisms" in n])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_retrofit_takes_a_folder_and_keeps_the_saved_class(tiny_checkpoints, tmp_path):
    """Issue 15: a model id / folder is loaded with load_model (not 'cannot retrofit a 'unknown' model')."""
    from conftest import TINY
    from transformers import BertForSequenceClassification

    model = retrofit(str(tiny_checkpoints["bert"]), "fixed", radius=2)
    assert model.config.posprobe["radius"] == 2 and added_parameters(model) == L * H * 5
    torch.manual_seed(0)
    BertForSequenceClassification(__import__("transformers").BertConfig(**TINY, num_labels=3)).save_pretrained(
        tmp_path / "clf"
    )
    clf = retrofit(tmp_path / "clf", "tisa")
    assert type(clf).__name__ == "BertForSequenceClassification"


@pytest.mark.parametrize(
    "model, kwargs, error, fragment",
    [
        (123, {}, TypeError, "model must be a loaded model, a hub id or a folder"),
        ("FOLDER", {"radius": "8"}, TypeError, "radius must be a whole number"),
        ("FOLDER", {"kernels": 2, "init": "fit:FILE"}, ValueError, "kernels 2 differs from the S = 3"),
    ],
)
def test_library_arguments_are_checked_first(tiny_checkpoints, tmp_path, monkeypatch, model, kwargs, error, fragment):
    import posprobe.checkpoint.loading as loading

    _kernels_file(tmp_path / "k.safetensors")
    monkeypatch.setattr(loading, "build_model", lambda *a, **k: pytest.fail("loaded before checking the arguments"))
    kwargs = {k: (f"fit:{tmp_path / 'k.safetensors'}" if v == "fit:FILE" else v) for k, v in kwargs.items()}
    with pytest.raises(error) as info:
        retrofit(str(tiny_checkpoints["bert"]) if model == "FOLDER" else model, "tisa", **kwargs)
    assert isinstance(info.value, PosprobeError) and fragment in str(info.value)
    assert "--" not in str(info.value)  # library wording


def test_save_retrofitted_is_the_cli_folder(tiny_checkpoints, tmp_path):
    """Issue 8: one writer; library users get the folder the CLI writes (tokenizer files included)."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoints["bert"], src)
    (src / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    model = retrofit(str(src), "composite")
    out = save_retrofitted(model, tmp_path / "out")
    names = ["config.json", "model.safetensors", "posprobe_initial.safetensors", "vocab.txt"]  # + initial values
    assert sorted(p.name for p in out.iterdir()) == names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    with pytest.raises(PosprobeError, match="already exists and is not an empty folder"):
        save_retrofitted(model, out)
    (tmp_path / "empty").mkdir()
    assert save_retrofitted(model, tmp_path / "empty", tokenizer_from=src) == tmp_path / "empty"


def test_save_retrofitted_errors_are_clean(tmp_path, monkeypatch):
    """Issue 15: `save_retrofitted(m, "/proc/nope")` is a PosprobeError, not a raw FileNotFoundError; a failed
    write leaves nothing behind."""
    model = retrofit(build_tiny("bert"), "fixed")
    with pytest.raises(PosprobeError, match="cannot write"):
        save_retrofitted(model, "/proc/nope/deeper")
    with pytest.raises(PosprobeError, match="cannot write"):
        save_retrofitted(model, "/proc/nope")

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(model), "save_pretrained", full_disk)
    with pytest.raises(PosprobeError, match="no space left"):
        save_retrofitted(model, tmp_path / "o")
    assert list(tmp_path.iterdir()) == []

    def full_disk_in_safetensors(self, *args, **kwargs):  # what safetensors raises for ENOSPC: not an OSError
        from safetensors import SafetensorError

        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              '"No space left on device" })')  # fmt: skip

    monkeypatch.setattr(type(model), "save_pretrained", full_disk_in_safetensors)
    with pytest.raises(PosprobeError, match="no space left"):
        save_retrofitted(model, tmp_path / "o")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="model must be a transformers model"):
        save_retrofitted("model", tmp_path / "o")


def test_a_saved_recipe_with_a_bad_radius_is_refused(tmp_path):
    model = retrofit(build_tiny("bert"), "fixed", radius=2)
    save_retrofitted(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["posprobe"]["radius"] = 0
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PosprobeError, match="recipe in the model's config is invalid .radius must be at least 1"):
        load_model(tmp_path / "m")


@pytest.mark.integration
def test_packaged_model_by_name():
    """Issue 15: `retrofit("all-MiniLM-L6-v2", "tisa")` said "cannot retrofit a 'unknown' model"."""
    model = retrofit("all-MiniLM-L6-v2", "tisa")
    assert model.config.model_type == "bert" and added_parameters(model) == 3 * 5 * 12 * 6


def test_retrofit_refuses_a_model_with_nan_weights():
    """Issue 14 §2 in the library: an in-memory model with a NaN weight is refused, as its folder would be."""
    model = build_tiny("bert")
    with torch.no_grad():
        model.embeddings.position_embeddings.weight[0, 0] = float("nan")
    with pytest.raises(PosprobeError, match="NaN or infinite"):
        retrofit(model, "fixed")
