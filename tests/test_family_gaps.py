"""Issue 34's gap, visible: every causal-LM and masked-LM model type of the installed transformers is read by the
family table (an analysable entry, with its parity case in tests/family_models.py), refused in one line (no softmax
attention in any layer, or a draft model that runs only beside its backbone), or named below with the reason it is
not read yet. Adding a family removes its line here; a new transformers version with new types fails until each is
read, refused or listed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from family_models import CASES, case

import posprobe
from posprobe.errors import PosprobeError
from posprobe.families import family_for_type

# model type -> why posprobe does not read it yet (none of these has an analysable entry): empty since every type of
# transformers 5.25 is read or refused; a newer release's new types land here, each with its reason, until read
NOT_YET: dict[str, str] = {}

# The causal-LM and masked-LM model types of the transformers release posprobe is tested with (TESTED_TRANSFORMERS,
# pinned in constraints/tested.txt), one a line. The gap is judged against this list, so a newer transformers' new
# types fail no test here: `.ci/newest` lists them. Written by `python tests/test_family_gaps.py` under the pinned
# release; test_the_recorded_types_are_the_installed_ones keeps it true.
TESTED_TYPES_FILE = Path(__file__).resolve().parent / "data" / "transformers_lm_types.txt"


def installed_lm_types() -> set[str]:
    """The causal-LM and masked-LM model types of the installed transformers."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def _lm_types() -> set[str]:
    """The language-model types of the tested transformers release (`TESTED_TYPES_FILE`)."""
    return set(TESTED_TYPES_FILE.read_text(encoding="utf-8").split())


def _unread(model_type: str) -> bool:
    """Neither read (an analysable entry) nor refused (an entry saying it has no softmax attention, or that it is a
    draft model attending another model's keys and values)."""
    family = family_for_type(model_type)
    return family is None or (family.softmax_attention and not family.analysable and not family.draft_of)


def test_every_language_model_type_is_read_refused_or_listed_as_not_yet():
    gap = {t for t in _lm_types() if _unread(t)}
    assert sorted(gap - set(NOT_YET)) == [], "read, refuse or list these model types"
    assert sorted(set(NOT_YET) - gap) == [], "these are read or refused now (or left transformers): drop their line"
    assert all(reason and "\n" not in reason for reason in NOT_YET.values())


def test_the_recorded_types_are_the_installed_ones():
    """Under the tested transformers release the recorded list is exactly its types (else: regenerate it, see
    `TESTED_TYPES_FILE`); under another release there is nothing to compare, and `.ci/newest` reports the new ones."""
    from importlib.metadata import version

    from posprobe.version import TESTED_TRANSFORMERS

    if version("transformers") != TESTED_TRANSFORMERS:
        pytest.skip(f"transformers {version('transformers')} is not the tested {TESTED_TRANSFORMERS}")
    assert sorted(installed_lm_types() ^ _lm_types()) == []


def test_every_read_language_model_type_has_its_parity_case():
    """An analysable language-model type is checked against its own module (tests/family_models.py)."""
    tested = {case(name).model_type for name in CASES} | {
        "t5", "mt5", "umt5", "longt5", "mpnet", "deberta-v2", "deberta",  # tests/test_families_bias.py
        "bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "gpt2",  # tests/conftest.py checkpoints
        "gpt-sw3",  # test_gpt_sw3_reads_as_gpt2 below
        "musicgen", "musicgen_melody",  # test_musicgen_reads_the_full_models_config below
    }  # fmt: skip
    read = {t for t in _lm_types() if (f := family_for_type(t)) is not None and f.analysable}
    assert sorted(read - tested) == []


@pytest.mark.parametrize("model_type", ["fnet", "yoso", "nystromformer", "mra", "perceiver"])
def test_types_without_softmax_attention_are_refused_in_one_line(model_type, tmp_path):
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 32}))
    save_file({"embeddings.word_embeddings.weight": np.zeros((4, 32), dtype=np.float32)},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    with pytest.raises(PosprobeError) as err:
        posprobe.profiles(str(tmp_path))
    message = str(err.value)
    assert f"({model_type}) has no" in message and "no attention scores" in message and "\n" not in message


@pytest.mark.slow
def test_exaone_reads_its_checkpoint_names_and_the_loaded_ones(tmp_path):
    """EXAONE 3 files name tensors transformer.wte / transformer.h.{l}.attn.attention.q_proj; transformers loads
    them as Llama (model.layers.{l}.self_attn.q_proj): both read to the same scores."""
    import torch
    from family_models import build
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base = build("exaone")
    torch.manual_seed(1)
    lm = AutoModelForCausalLM.from_config(base.config).double().eval()
    lm.model.load_state_dict(base.state_dict())
    lm.save_pretrained(tmp_path / "lm")
    with safe_open(str(tmp_path / "lm" / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert {"transformer.wte.weight", "transformer.h.0.attn.attention.q_proj.weight"} <= names
    on_disk = posprobe.fhat(str(tmp_path / "lm"), layer=1, positions=12).matrices
    loaded = posprobe.fhat(base, layer=1, positions=12).matrices
    np.testing.assert_allclose(on_disk, loaded, rtol=1e-9, atol=1e-12)
    assert np.std(loaded) > 0


# model type -> (its fused Q/K/V projection in files of layer 0, its LM head class in transformers)
FUSED_ON_DISK = {
    "gte": ("gte.encoder.layer.0.attention.qkv_proj.weight", "AutoModelForMaskedLM"),
    "nomic_bert": ("nomic_bert.encoder.layers.0.attn.Wqkv.weight", "AutoModelForMaskedLM"),
    "jina_embeddings_v3": ("roberta.encoder.layers.0.mixer.Wqkv.weight", "AutoModelForMaskedLM"),
    "sarvam_moe": ("model.layers.0.attention.query_key_value.weight", "AutoModelForCausalLM"),
}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(FUSED_ON_DISK))
def test_fused_checkpoints_read_as_their_loaded_models(model_type, tmp_path):
    """transformers splits these files' one Q/K/V Linear into q_proj / k_proj / v_proj on load (its conversion
    mapping: Chunk in three, or Split by size for Sarvam-MoE's grouped keys) and renames the rest (emb_ln,
    encoder.layers, attention.query_layernorm, word_embeddings); save_pretrained inverts that, so the saved folder
    holds the files' layout (no hub: a real checkpoint is not downloaded). The folder on disk and the loaded model
    in memory read to the same scores."""
    import torch
    import transformers
    from family_models import build
    from safetensors import safe_open

    base = build(model_type)
    fused, head = FUSED_ON_DISK[model_type]
    torch.manual_seed(1)
    lm = getattr(transformers, head).from_config(base.config).double().eval()
    missing, _ = lm.base_model.load_state_dict(base.state_dict(), strict=False)  # Jina's LM drops the pooler
    assert missing == []
    lm.save_pretrained(tmp_path / "lm")
    with safe_open(str(tmp_path / "lm" / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert fused in names and not any("q_proj" in name for name in names)
    assert "layers.0.self_attn.q_proj.weight" in base.state_dict()
    on_disk = posprobe.fhat(str(tmp_path / "lm"), layer=1, positions=12).matrices
    loaded = posprobe.fhat(base, layer=1, positions=12).matrices
    np.testing.assert_allclose(on_disk, loaded, rtol=1e-9, atol=1e-12)
    assert np.std(loaded) > 0


@pytest.mark.slow
def test_nemotron_h_reads_the_older_config_layout(tmp_path):
    """Nemotron-H configs name their layer kinds as layers_block_type (saved by transformers now; its length is the
    layer count) or as the older hybrid_override_pattern beside num_hidden_layers ('M' Mamba-2, '*' attention, '-'
    MLP, 'E' MoE): both read to the same scores, and the layer with no attention before the attention layer reads
    NaN."""
    from family_models import build

    model = build("nemotron_h")
    model.save_pretrained(tmp_path / "new")
    model.save_pretrained(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    assert config.pop("layers_block_type") == ["linear_attention", "full_attention", "mlp", "full_attention", "moe"]
    config.update(hybrid_override_pattern="M*-*E", num_hidden_layers=5)
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    new = posprobe.fhat(str(tmp_path / "new"), layer=3, positions=12).matrices
    old = posprobe.fhat(str(tmp_path / "old"), layer=3, positions=12).matrices
    np.testing.assert_array_equal(old, new)
    assert np.std(new) > 0
    for folder in ("new", "old"):  # layer 0 is a Mamba-2 layer: no score (NaN), said so
        mamba = posprobe.fhat(str(tmp_path / folder), layer=0, positions=12)
        assert np.isnan(mamba.matrices).all() and "linear_attention" in str(mamba.layer_kind)


def test_gpt_sw3_reads_as_gpt2(tmp_path):
    """transformers builds GPT-2's config class for 'gpt-sw3' (a name it keeps for GPT-SW3's tokenizer): a config
    that says gpt-sw3 reads to the scores of the same checkpoint saying gpt2 (GPT-2's own parity is checked in
    tests/test_fhat.py and tests/test_capture.py)."""
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt-sw3", vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = AutoModel.from_config(config).double().eval()
    for folder in ("gpt2", "sw3"):
        model.save_pretrained(tmp_path / folder)
    saved = json.loads((tmp_path / "sw3" / "config.json").read_text())
    assert saved["model_type"] == "gpt2"
    (tmp_path / "sw3" / "config.json").write_text(json.dumps({**saved, "model_type": "gpt-sw3"}))
    for mode in ("paper", "faithful"):
        sw3 = posprobe.fhat(str(tmp_path / "sw3"), layer=1, positions=10, mode=mode)
        gpt2 = posprobe.fhat(str(tmp_path / "gpt2"), layer=1, positions=10, mode=mode)
        assert sw3.model_type == "gpt-sw3" and gpt2.model_type == "gpt2"
        np.testing.assert_array_equal(sw3.matrices, gpt2.matrices)
        assert np.std(sw3.matrices) > 0


def test_pre_norm_flaubert_is_refused_in_one_line(tmp_path):
    """FlauBERT's pre_norm layers: transformers' own module fails on them (no reference to check), so such a
    config is refused, saying why; the post-norm one (its parity case) reads."""
    from family_models import build

    build("flaubert").save_pretrained(tmp_path)
    assert np.std(posprobe.fhat(str(tmp_path), layer=1, positions=10).matrices) > 0
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "pre_norm": True}))
    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(str(tmp_path), layer=1, positions=10)
    assert "pre_norm" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_cpmant_with_prompt_tokens_reads_the_text_pairs(tmp_path):
    """CPM-Ant runs prompt_length prompt tokens (rows after the vocabulary in its word table, segment 0) before
    every text (segment 2): the text's scores are those of its own pairs, bucket(j - i) within its segment, the
    prompts being further keys; the average word is the vocabulary's (not the prompt rows'). Checked against the
    model's first-layer softmax input on text pairs (token 5 the average word: token 0 is its padding); the
    capture refuses such a config in one line (its softmax also spans the prompt)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from posprobe.capture import capture
    from posprobe.checkpoint import WeightReader, resolve_model
    from posprobe.families.context import ModelContext, content_free_scores

    prompt, n = 3, 10
    config = AutoConfig.for_model("cpmant", **{**CASES["cpmant"][1], "prompt_length": prompt, "prompt_types": 3})
    torch.manual_seed(0)
    model = AutoModel.from_config(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name:
                p.add_(0.1 * torch.randn_like(p))
        table = model.get_input_embeddings().weight
        assert table.shape[0] == 99 + 3 * prompt  # the model's prompt is type 2's
        model.save_pretrained(tmp_path)
        table[5] = table[:99].mean(0)
        seen = []
        softmax = torch.nn.functional.softmax

        def record(x, *args, **kwargs):
            seen.append(x)
            return softmax(x, *args, **kwargs)

        torch.nn.functional.softmax = record
        try:
            model(input_ids=torch.full((1, n), 5))
        finally:
            torch.nn.functional.softmax = softmax
    theirs = seen[0][0, :, prompt:, prompt:].numpy()  # layer 0, text queries and keys
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    np.testing.assert_allclose(content_free_scores(ctx, 0, n), theirs, rtol=1e-6, atol=1e-6)

    class Probs:  # a reducer of attention probabilities
        needs = ("probs",)

        def add(self, batch):
            pass

        def result(self):
            return None

    with pytest.raises(PosprobeError) as err:
        capture(model, [Probs()], input_ids=[[5, 6, 7]], max_length=8)
    assert "prompt tokens" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_indexed_layers_say_their_kind_and_refuse_data_conditioned_inputs(tmp_path):
    """A sparse indexed layer (DeepSeek V3.2) attends the top index_topk keys its indexer picks per query: its kind
    says so ('indexed (top-k)'), each query with more visible keys keeps exactly index_topk of them (not the nearest
    ones alone), and data-conditioned scores are refused in one line (the pick is read on the content-free input)."""
    from family_models import build

    from posprobe.checkpoint import WeightReader, resolve_model
    from posprobe.families.context import ModelContext, content_free_scores

    build("deepseek_v32").save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    n, topk = 16, ctx.config["index_topk"]
    kind = ctx.layer_kinds(n)[0]
    assert kind.describe().startswith("indexed (top-k)") and f"keeps {topk} keys" in kind.describe()
    picked = kind.allowed(n)
    np.testing.assert_array_equal(picked.sum(1), np.minimum(np.arange(n) + 1, topk))
    assert not picked[np.triu_indices(n, 1)].any()
    recent = np.tril(np.ones((n, n), dtype=bool)) & ~np.tril(np.ones((n, n), dtype=bool), -topk)
    assert (picked != recent).any()  # the indexer's pick, not a window of the last index_topk keys
    inputs = ctx.layer_inputs({0: np.ones(ctx.shape.hidden)})
    with pytest.raises(PosprobeError) as err:
        content_free_scores(ctx, 0, n, inputs=inputs)
    assert "indexer" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_hyper_connection_streams_of_text_are_refused(tmp_path):
    """HY-V4 passes several hyper-connection streams between layers: its layer inputs are read where every stream
    holds the same vector (the embedding-level input, its parity case); hidden states of text are refused."""
    from family_models import build

    from posprobe.checkpoint import WeightReader, resolve_model
    from posprobe.families.context import ModelContext

    build("hy_v4").save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    ctx = ModelContext(source, WeightReader(source.path, source.weight_format), mode="faithful")
    with pytest.raises(PosprobeError) as err:
        ctx.query_key_of(np.ones((3, ctx.shape.hidden)), 1)
    assert "hyper-connection streams" in str(err.value) and "\n" not in str(err.value)


def test_zamba2_reads_its_rope_switch_and_refuses_data_conditioned_inputs():
    """Zamba2's shared blocks rotate only with use_mem_rope (else NoPE); they read [hidden; embeddings] of each
    token, so a data-conditioned input (the hidden state alone) is refused in one line."""
    from family_models import build

    from posprobe.architectures.table import NOPE, ROTARY, position_kind
    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
    from posprobe.families.context import ModelContext

    assert position_kind({"model_type": "zamba2", "use_mem_rope": True})[0] == ROTARY
    assert position_kind({"model_type": "zamba2"})[0] == NOPE  # the config class's default: off
    model = build("zamba2")
    ctx = ModelContext(source_from_model(model), StateDictReader(model))
    assert [ctx.stored_layer(layer) for layer in range(4)] == [0, 1, 2, 1]  # blocks 0, 1, 0 at depths 1, 2, 3
    with pytest.raises(PosprobeError) as err:
        ctx.query_key_of(np.ones((3, 32)), 3)
    assert "[hidden state; embeddings]" in str(err.value) and "\n" not in str(err.value)


def test_inkling_with_other_heads_in_its_sliding_layers_is_refused_in_one_line():
    """posprobe's score matrices take one query-head count for every layer: an Inkling whose sliding layers have
    another (swa_num_attention_heads) is refused when a sliding layer is scored; its other layers read."""
    import torch
    from transformers import AutoConfig, AutoModel

    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
    from posprobe.families.context import ModelContext, content_free_scores

    config = AutoConfig.for_model("inkling_text", **{**case("inkling_text").config, "swa_num_attention_heads": 2})
    torch.manual_seed(0)
    model = AutoModel.from_config(config).double().eval()
    ctx = ModelContext(source_from_model(model), StateDictReader(model))
    assert np.isfinite(content_free_scores(ctx, 1, 8)).all()  # the full layer
    with pytest.raises(PosprobeError) as err:
        content_free_scores(ctx, 0, 8)  # the sliding layer
    assert "swa_num_attention_heads" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inkling2_text", "inkling2_loop_text"])
def test_inkling2_sinks_are_its_modules_own_on_the_content_free_input_and_texts_are_refused(name):
    """Inkling 2's sink logits depend on the layer input (s_h = (y W_S)_h): on the content-free input (each layer
    and each earlier block's state the embedding-level input, as `reference_scores` feeds them) posprobe's are the
    module's own at every depth (the loop's later passes: through its message gates), and profiles report the share
    they take (SPEC §9, §14); its layers read an attention mix over earlier blocks' states, which one mean hidden
    state does not give: text-conditioned scores are refused."""
    import copy

    from family_models import build, reference_scores

    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
    from posprobe.families.context import ModelContext
    from posprobe.families.relative_logits import sink_logits

    model = build(name)
    recorded = []  # (n, H) per call: one per depth, in depth order

    def keep(module, args, out):  # returns None: the output goes on unchanged
        recorded.append(out[0].double().numpy())

    ours = copy.deepcopy(model)  # reference_scores sets the word table's row 0 to its mean: the mean moves
    ctx = ModelContext(source_from_model(ours), StateDictReader(ours))
    hooks = [layer.self_attn.sink_proj.register_forward_hook(keep) for layer in model.layers]
    ref = reference_scores(model, 8)
    for hook in hooks:
        hook.remove()
    depths = ctx.layers()
    assert len(recorded) == depths == (8 if "loop" in name else 4)
    for layer, theirs in enumerate(recorded):  # the same at every position
        np.testing.assert_allclose(sink_logits(ctx, layer), theirs[3], rtol=1e-4, atol=1e-4 * np.abs(theirs).max())
    assert np.ptp(np.stack([sink_logits(ctx, layer) for layer in range(depths)])) > 1  # they differ per depth
    shares = posprobe.profiles(ours, positions=8).learned_sink_share  # (L, H): the sink's mean share of a query's
    scores = np.where(ref.allowed[:, None], ref.scores, -np.inf)  # attention, from the module's scores and sinks
    sinks = np.exp(np.stack([logits[0] for logits in recorded]))[..., None]  # (L, H, 1)
    expected = (sinks / (sinks + np.exp(scores).sum(-1))).mean(-1)
    np.testing.assert_allclose(shares, expected, rtol=1e-3, atol=1e-5)
    assert shares.min() < 0.05 and shares.max() > 0.95  # some heads' sinks take almost nothing, some almost all
    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(ours, layer=1, positions=6, input_ids=[[4, 5, 6, 7, 8, 9], [9, 8, 7, 6, 5, 4]])
    assert "cannot read inputs from text" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inkling2_text", "inkling2_loop_text"])
def test_inkling2_attention_on_texts_reports_the_share_its_input_conditioned_sinks_take(name):
    """On texts `posprobe attention` records Inkling 2's own eager attention, whose softmax runs over one more
    column per query (the sink logit of that query's input): A over the real keys sums to one less the sink's
    share, reported per layer and head as learned sinks are (SPEC §14)."""
    import copy

    import torch
    from family_models import build

    from posprobe.pipelines.attention import attention_profiles

    model = build(name)
    corpus = [[4, 5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
    result = attention_profiles(copy.deepcopy(model), input_ids=corpus, max_length=12, batch_size=2,
                                weights_correlation=False)  # fmt: skip
    real = []
    with torch.no_grad():
        for ids in corpus:  # each text alone, unpadded: the share of each query's attention left to real tokens
            probs = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
            real.append(np.stack([a[0].double().numpy().sum(-1) for a in probs]))  # (L, H, n)
    expected = 1 - np.concatenate(real, -1).mean(-1)
    assert expected.shape == (8 if "loop" in name else 4, 4)  # every depth (the loop's layers once per pass)
    np.testing.assert_allclose(result.learned_sinks.learned_sink_share, expected, atol=1e-5)
    assert expected.max() > 0.1


@pytest.mark.slow
def test_gemma4_bidirectional_configs_and_gemma3n_texts_are_refused_in_one_line(tmp_path):
    """Gemma 4 text models read causal (use_bidirectional_attention None or 'vision'); 'all' makes every layer
    bidirectional, with a window of its own: refused, saying why. Gemma 3n's hidden states are stacks of AltUp
    streams, not one vector per token: scores conditioned on texts are refused, saying why."""
    from family_models import build

    build("gemma4_text").save_pretrained(tmp_path / "g4")
    assert np.std(posprobe.fhat(str(tmp_path / "g4"), layer=1, positions=10).matrices) > 0
    config = json.loads((tmp_path / "g4" / "config.json").read_text())
    (tmp_path / "g4" / "config.json").write_text(json.dumps({**config, "use_bidirectional_attention": "all"}))
    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(str(tmp_path / "g4"), layer=1, positions=10)
    assert "use_bidirectional_attention 'all'" in str(err.value) and "\n" not in str(err.value)
    model = build("gemma3n_text")
    with pytest.raises(PosprobeError) as err:
        posprobe.fhat(model, layer=1, positions=4, input_ids=[list(range(4, 12))] * 4)
    assert "not (batch, tokens, width)" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_gemma4_rotary_bands_take_layers_of_one_head_size(tmp_path):
    """Gemma 4's global layers have heads of their own size (16 dims in the test model, 8 elsewhere): rotary bands
    of global or of local layers read each layer's own heads; layers of both kinds at once are refused. On text,
    a layer that reuses an earlier layer's keys has that layer's key bands exactly, and queries of its own."""
    import torch
    from family_models import build

    model = build("gemma4_text", torch.float32)  # float64 Gemma 4 gives NaN where a window meets padding
    model.save_pretrained(tmp_path)
    assert posprobe.rotary(str(tmp_path), layers=[1, 3]).head_dim == 16
    assert posprobe.rotary(str(tmp_path), layers=[0, 2]).head_dim == 8
    texts = [list(range(4, 10 + i)) for i in range(12)]
    for layers in ([1, 3], [0, 2]):  # layer 3 reuses layer 1's keys, layer 2 layer 0's
        bands = posprobe.rotary(model, layers=layers, input_ids=texts, batch_size=5)
        np.testing.assert_array_equal(bands.k_band_norm[1], bands.k_band_norm[0])
        assert np.abs(bands.q_band_norm[1] - bands.q_band_norm[0]).max() > 1e-3
    with pytest.raises(PosprobeError) as err:
        posprobe.rotary(str(tmp_path))
    assert "one head shape" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_gemma4_global_head_size_reads_from_either_config_spelling(tmp_path):
    """Gemma 4 configs give the global layers' heads as global_head_dim / num_global_key_value_heads (as released)
    or as transformers' per_layer_config (as `save_pretrained` writes them): both read to the same scores."""
    from family_models import build

    build("gemma4_text").save_pretrained(tmp_path / "saved")
    build("gemma4_text").save_pretrained(tmp_path / "released")
    config = json.loads((tmp_path / "released" / "config.json").read_text())
    global_heads = {"head_dim": 16, "num_key_value_heads": 1}
    assert config.pop("per_layer_config") == {"1": global_heads, "3": global_heads}
    config.update(global_head_dim=16, num_global_key_value_heads=1)
    (tmp_path / "released" / "config.json").write_text(json.dumps(config))
    for layer in (1, 3):
        saved = posprobe.fhat(str(tmp_path / "saved"), layer=layer, positions=10).matrices
        np.testing.assert_array_equal(posprobe.fhat(str(tmp_path / "released"), layer=layer, positions=10).matrices,
                                      saved)  # fmt: skip
        assert np.std(saved) > 0


def test_whisper_runs_and_counts_its_decoder(tmp_path):
    """Whisper's encoder reads audio features: `attention` runs its decoder (text) without encoder states, its
    sizes (layers, heads, positions) are the decoder's, here unlike the encoder's (3 layers of 2 heads), and the
    weights commands say they read the decoder."""
    from family_models import build

    from posprobe.analysis.params import positional_parameter_counts
    from posprobe.pipelines.attention import attention_profiles

    model = build("whisper")
    result = attention_profiles(model, input_ids=[[5, 6, 7, 8, 9]], max_length=8, weights_correlation=False)
    assert result.stack == "decoder" and result.n_layers == 2 and result.n_heads == 4
    assert result.layer_kinds == ["global", "global"]
    counts = positional_parameter_counts(model.config.to_dict())
    assert (counts.n_layers, counts.n_heads, counts.absolute) == (2, 4, 64 * 32)
    model.save_pretrained(tmp_path)
    for stack in ("encoder", "decoder"):  # the one stack read, whichever is asked
        scores = posprobe.fhat(str(tmp_path), layer=1, positions=10, stack=stack)
        assert scores.stack == "decoder" and scores.matrices.shape == (4, 10, 10)


@pytest.mark.parametrize("name", ["musicgen", "musicgen_melody"])
def test_musicgen_reads_the_full_models_config(name, tmp_path):
    """MusicGen's causal LM saves a decoder config (model_type musicgen_decoder, its parity case); the full model's
    config (model_type musicgen) nests it under `decoder`, beside its text and audio encoders: both read the
    decoder's sizes and scores."""
    from family_models import build

    model = build(f"{name}_decoder")
    model.save_pretrained(tmp_path / "decoder")
    model.save_pretrained(tmp_path / "full")
    decoder = json.loads((tmp_path / "decoder" / "config.json").read_text())
    full = {"model_type": name, "decoder": decoder, "text_encoder": {"model_type": "t5", "d_model": 48},
            "audio_encoder": {"model_type": "encodec", "hidden_size": 24}, "is_encoder_decoder": True}  # fmt: skip
    (tmp_path / "full" / "config.json").write_text(json.dumps(full))
    ours = posprobe.fhat(str(tmp_path / "full"), layer=1, positions=12, mode="faithful")
    theirs = posprobe.fhat(str(tmp_path / "decoder"), layer=1, positions=12, mode="faithful")
    assert ours.model_type == name and theirs.model_type == f"{name}_decoder"
    np.testing.assert_array_equal(ours.matrices, theirs.matrices)
    assert ours.matrices.shape == (4, 12, 12) and np.std(ours.matrices) > 0


def test_moshi_reads_the_temporal_layers_of_a_full_checkpoint(tmp_path):
    """A full Moshi checkpoint holds the temporal transformer (decoder.model.layers.{l}) and a depth decoder whose
    layers have the same names, as long, under depth_decoder.layers.{l}: the temporal ones are read (the table
    names them model.layers, so which one a reader lists first does not decide)."""
    from family_models import build
    from safetensors.numpy import save_file

    model = build("moshi")
    model.save_pretrained(tmp_path / "base")
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    full = {f"decoder.model.{k}": v for k, v in state.items()}
    full |= {f"depth_decoder.{k}": rng.normal(size=v.shape).astype(np.float32)
             for k, v in state.items() if k.startswith("layers.")}  # fmt: skip
    (tmp_path / "full").mkdir()
    save_file(full, str(tmp_path / "full" / "model.safetensors"))
    (tmp_path / "full" / "config.json").write_text((tmp_path / "base" / "config.json").read_text())
    ours = posprobe.fhat(str(tmp_path / "full"), layer=1, positions=12, mode="faithful").matrices
    theirs = posprobe.fhat(str(tmp_path / "base"), layer=1, positions=12, mode="faithful").matrices
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert np.std(ours) > 0


@pytest.mark.slow
def test_trocr_checkpoint_loads_as_its_causal_lm(tmp_path):
    """TrOCR has no base model class: `attention` on its folder loads its causal LM (the decoder) instead."""
    from family_models import build

    from posprobe.pipelines.attention import attention_profiles

    build("trocr").save_pretrained(tmp_path)
    result = attention_profiles(str(tmp_path), input_ids=[[5, 6, 7, 8]], max_length=8, weights_correlation=False)
    assert (result.n_layers, result.n_heads, result.model_type) == (2, 4, "trocr")
    assert np.isfinite(result.profiles.prob_profiles[:, :, 7 - 3 : 8]).all()


@pytest.mark.slow
@pytest.mark.parametrize("model_type, backbone", [("gemma4_assistant", "gemma4_text"),
                                                  ("gemma4_unified_assistant", "gemma4_unified_text")])  # fmt: skip
def test_gemma4_draft_models_attend_their_backbones_keys_and_are_refused_in_one_line(model_type, backbone, tmp_path):
    """Gemma 4's assistants (draft models for assisted decoding) have no key or value projection in any layer: each
    layer attends the keys and values its backbone passes in (shared_kv_states), and its input is the backbone's
    last hidden state beside the token's embedding (pre_projection reads 2 x backbone_hidden_size), so it does not
    run on a text alone. Its config is valid with the text config's per-layer inputs off (hidden_size_per_layer_input
    and vocab_size_per_layer_input 0), enable_moe_block and use_double_wide_mlp False and every layer KV-shared
    (num_kv_shared_layers = num_hidden_layers, which the config sets where it is 0); Gemma 4's default text config
    has per-layer inputs, so the assistant's default config is invalid. posprobe refuses it in one line that names
    its backbone."""
    import torch
    from family_models import _GEMMA4, SMALL
    from transformers import AutoConfig, AutoModelForCausalLM

    text = {**SMALL, **_GEMMA4, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0, "enable_moe_block": False, "use_double_wide_mlp": False}  # fmt: skip
    config = AutoConfig.for_model(model_type, text_config=text, backbone_hidden_size=16)
    assert config.text_config.num_kv_shared_layers == config.text_config.num_hidden_layers == 4
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert model.pre_projection.in_features == 2 * 16
    attention = [layer.self_attn for layer in model.model.layers]
    assert all(a.is_kv_shared_layer and hasattr(a, "q_proj") and not hasattr(a, "k_proj") for a in attention)
    with pytest.raises(ValueError, match="shared_kv_states"):
        model(input_ids=torch.tensor([[5, 6, 7]]))
    if model_type == "gemma4_assistant":
        with pytest.raises(Exception, match="hidden_size_per_layer_input must be 0"):
            AutoConfig.for_model(model_type)
    model.save_pretrained(tmp_path)
    refused = (
        lambda: posprobe.fhat(str(tmp_path), layer=0, positions=8),
        lambda: posprobe.attention_profiles(str(tmp_path), input_ids=[[5, 6, 7, 8]], weights_correlation=False),
        lambda: posprobe.states(str(tmp_path), input_ids=[[5, 6, 7, 8]] * 4),
    )
    for call in refused:
        with pytest.raises(PosprobeError) as err:
            call()
        message = str(err.value)
        assert "draft model" in message and "shared_kv_states" in message and backbone in message, message
        assert "\n" not in message


@pytest.mark.slow
def test_qwen4_exp_mixes_its_streams_as_its_module_and_keeps_ple_out_of_its_attention_layers():
    """Qwen4-Exp (issue 34, qwen4): an indexed layer reads the gated mix of its streams, each holding the
    embedding-level input, exactly as its hyper-connection module computes it; its PLE (hashed n-gram embeddings) is
    refused by its config on an attention layer, so no attention layer's content-free input holds it (SPEC §9); its
    indexer drops earlier keys but keeps each query's partial block; text-conditioned inputs are refused."""
    import torch
    from family_models import build
    from huggingface_hub.errors import StrictDataclassClassValidationError
    from transformers import AutoConfig

    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
    from posprobe.families.context import ModelContext
    from posprobe.families.stream_mix import gated_stream_mix

    model = build("qwen4_exp_text")
    ctx = ModelContext(source_from_model(model), StateDictReader(model), mode="faithful")
    x = np.random.default_rng(0).normal(size=(5, ctx.shape.hidden))
    streams = torch.from_numpy(x).repeat(1, model.config.hc_count)[None]
    with torch.no_grad():
        theirs = model.layers[1].attn_hyper_connection(streams)[0][0].numpy()
    np.testing.assert_allclose(gated_stream_mix(ctx, 1, x), theirs, rtol=1e-5, atol=1e-6)  # its norms: float32
    assert np.abs(gated_stream_mix(ctx, 1, x) - gated_stream_mix(ctx, 3, x)).max() > 1e-3  # a mix per layer
    config = case("qwen4_exp_text").config
    with pytest.raises(StrictDataclassClassValidationError, match="PLE is only supported on linear_attention layers"):
        AutoConfig.for_model("qwen4_exp_text", **{**config, "ple_layer_ids": [2]})  # layer 1: indexed
    n, size = 16, model.config.indexer_compress_ratio
    picked = ctx.layer_kinds(n)[1].allowed(n)
    causal = np.tril(np.ones((n, n), dtype=bool))
    assert not (picked & ~causal).any() and (causal & ~picked).any()
    for i in range(n):
        assert picked[i, (i + 1) // size * size : i + 1].all()  # the query's partial block
    with pytest.raises(PosprobeError) as err:
        ctx.query_key_of(np.ones((3, ctx.shape.hidden)), 1)
    assert "hyper-connection streams" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_blt_reads_its_causal_lm_and_refuses_byte_stacks_of_two_layouts(tmp_path):
    """BLT's causal LM (tensors under model.) reads as its base model, and a text runs through it (its byte layers'
    attention; its global layer, 2, none); a byte decoder with other heads than the byte encoder is refused in one
    line (posprobe reads the byte stacks with one layout)."""
    import torch
    from family_models import build
    from transformers import AutoModelForCausalLM

    from posprobe.pipelines.attention import attention_profiles

    base = build("blt")
    base.save_pretrained(tmp_path / "base")
    torch.manual_seed(1)
    lm = AutoModelForCausalLM.from_config(base.config).double().eval()
    lm.model.load_state_dict(base.state_dict())
    lm.save_pretrained(tmp_path / "lm")
    ours = posprobe.fhat(str(tmp_path / "lm"), layer=4, positions=12).matrices
    np.testing.assert_array_equal(ours, posprobe.fhat(str(tmp_path / "base"), layer=4, positions=12).matrices)
    assert np.std(ours) > 0
    lm.float().save_pretrained(tmp_path / "lm32")  # float64: transformers' eager BLT gives NaN (test_capture_families)
    result = attention_profiles(str(tmp_path / "lm32"), input_ids=[[5, 6, 7, 8, 9]], max_length=8)
    assert result.attention_layers == [0, 1, 3, 4, 5] and result.n_layers == 6
    assert np.isnan(result.profiles.mean_distance[2]).all() and np.isfinite(result.profiles.mean_distance[[0, 5]]).all()
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    config["decoder_config"]["num_attention_heads"] = 2
    (tmp_path / "base" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PosprobeError, match="local_decoder other num_attention_heads than its local_encoder") as err:
        posprobe.profiles(str(tmp_path / "base"))
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_funnel_later_blocks_attend_on_pooled_grids_as_its_entry_says():
    """Funnel's entry reads its first block only, and says why (issue 34, stacks): a later block's queries sit on
    pooled positions of their own, its first layer attends them to the previous block's n keys, its other layers
    the pooled ones. The module does exactly that (n = 16, blocks of 3 and 2 layers): were it to attend n x n over
    positions 0..n-1 in every layer, its later blocks could be read as the first one is."""
    import torch
    from family_models import build

    from posprobe.architectures.table import config_value
    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
    from posprobe.families.context import ModelContext

    model = build("funnel")
    model.config.block_sizes = [3, 2]
    model = type(model)(model.config).double().eval()  # blocks of 3 and 2 layers, the case's other settings
    shapes, softmax = [], torch.softmax

    def record(x, *args, **kwargs):
        shapes.append(tuple(x.shape[-2:]))
        return softmax(x, *args, **kwargs)

    torch.softmax = record
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 16, dtype=torch.long))
    finally:
        torch.softmax = softmax
    assert shapes[:5] == [(16, 16)] * 3 + [(8, 16), (8, 8)]  # block 0, then block 1: pooled queries, then both
    structure = model.encoder.attention_structure
    assert structure.stride_pool_pos(list(range(16)), 1) == [-1, 1, 3, 5, 7, 9, 11, 13]  # <cls> at 1 - 2
    ctx = ModelContext(source_from_model(model), StateDictReader(model))
    assert ctx.layers() == 3 == config_value(model.config.to_dict(), "layers")
    assert "pool_q_only" in ctx.family.description and "1 - 2^b" in ctx.family.description


if __name__ == "__main__":  # regenerate the recorded list under the pinned transformers
    TESTED_TYPES_FILE.write_text("".join(f"{t}\n" for t in sorted(installed_lm_types())), encoding="utf-8")
