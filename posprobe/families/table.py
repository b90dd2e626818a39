"""The family table: one entry per transformers model family, the one place posprobe's family knowledge lives.

An entry (`Family`) says how a family encodes position (`kind`, one of `KINDS`), whether its attention is causal,
where its tensors live and how to read them. Tensor names are *suffixes* (a task-head prefix such as 'bert.' or
'model.' does not matter); per-layer names hold `{l}` (the layer) and, for encoder-decoder families, `{stack}`
('encoder' or 'decoder'). Sizes come from config.json under any of the names in `CONFIG_KEYS`.

Who reads it: `posprobe.families.context` (the one model reader: tensors, layouts, norms, what is analysable)
and the score modules (`SCORE_MODULES`, one per kind: SPEC §3, §9), `posprobe.analysis.params` (which families
have a learned table), `posprobe.retrofitting` (`retrofit=True` entries), `posprobe.checkpoint.config` (which
configs are checked in depth), the tests (one tiny config per entry) and the README's table of families.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Position mechanism kinds (SPEC §1, §9) and the module that computes each kind's content-free scores.
LEARNED = "learned"  # learned absolute table E_P (SPEC §1-3)
SINUSOIDAL = "sinusoidal"  # fixed sin/cos absolute table, built as the model builds it
ROTARY = "rotary"  # RoPE on q and k
BUCKET_BIAS = "bucket_bias"  # learned bias[h, bucket(j - i)] (T5, MPNet)
ALIBI = "alibi"  # -m_h |j - i|
DISENTANGLED = "disentangled"  # DeBERTa-v2 c2p + p2c
OTHER = "other"  # known, not analysed (see `Family.description`)
KINDS = (LEARNED, SINUSOIDAL, ROTARY, BUCKET_BIAS, ALIBI, DISENTANGLED, OTHER)
SCORE_MODULES = {
    LEARNED: "posprobe.families.absolute",
    SINUSOIDAL: "posprobe.families.absolute",
    ROTARY: "posprobe.families.rotary",
    ALIBI: "posprobe.families.alibi",
    BUCKET_BIAS: "posprobe.families.relative_bias",
    DISENTANGLED: "posprobe.families.disentangled",
}
TABLE_KINDS = (LEARNED, SINUSOIDAL)  # an absolute table E_P exists (stored or built): sections 1-3 of SPEC apply
KIND_NAMES = {
    LEARNED: "learned absolute table",
    SINUSOIDAL: "sinusoidal absolute positions (not learned)",
    ROTARY: "rotary embeddings (RoPE)",
    BUCKET_BIAS: "relative position buckets (learned bias)",
    ALIBI: "ALiBi attention biases",
    DISENTANGLED: "disentangled relative positions",
}
# How Q/K weights are stored (`Family.qkv`).
SEPARATE = "separate"  # Linear q and k: weight (H*d_h, d), q = x @ W.T + b
GPT2_CONV1D = "gpt2-conv1d"  # one Conv1D: weight (d, 3d) = [q | k | v] columns, y = x @ W + b
PER_HEAD = "per-head"  # one Linear (3d, d) whose rows are grouped per head: [q_h; k_h; v_h] (GPT-NeoX, BLOOM)
STACKED = "stacked"  # one Linear whose rows are [q (H*d_h); k (H_kv*d_h); v (H_kv*d_h)] (Phi-3)
# Norms (`Family.norm`): the layer norm applied before attention (and to the embeddings, where there is one).
LAYERNORM = "layernorm"  # (x - mean) / sqrt(var + eps) * w + b (b optional)
RMSNORM = "rmsnorm"  # x / sqrt(mean(x^2) + eps) * w
RMSNORM_PLUS1 = "rmsnorm+1"  # Gemma: x / sqrt(mean(x^2) + eps) * (1 + w)
NORMS = (LAYERNORM, RMSNORM, RMSNORM_PLUS1)

# Config field names, in the order they are looked for.
CONFIG_KEYS = {
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "attention_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers"),
    "hidden": ("hidden_size", "n_embd", "dim", "d_model", "emb_dim"),
    "head_dim": ("head_dim", "d_kv"),
    "positions": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
    "vocab": ("vocab_size", "n_vocab"),
    "eps": ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "layernorm_epsilon", "norm_epsilon"),
}


@dataclass(frozen=True)
class Family:
    """One model family. Only `name`, `model_types` and `kind` are required; the rest say where tensors live.

    Embedding level: `word` (vocabulary table), `position` (learned or stored table), `token_type`,
    `embedding_norm` (norm of the summed embeddings, prefix), `projection` (factorised embeddings, prefix;
    applied after the embedding norm, or before it with `projection_first`: DeBERTa-v2's embed_proj),
    `embed_scale` ('sqrt_hidden': the embeddings are multiplied by sqrt(d) in the table's dtype, Gemma;
    'scale_embedding': by sqrt(d) when config.json says scale_embedding, Marian / Pegasus / M2M100 / XGLM).
    Attention of layer `{l}`: `query` / `key` prefixes ('.weight', '.bias' appended; with `qkv` != SEPARATE
    `query` names the fused projection), `pre_norm` (the norm applied to the layer input before attention),
    `qk_norm` (prefixes of per-head norms applied to q and k before the positional mechanism where the
    checkpoint has them: Qwen3, Phi with qk_layernorm),
    `norm` (the kind of every norm above), `shared_layers` (ALBERT: one stored layer at every depth).
    `reserved_rows`: the position table starts with pad_token_id + 1 reserved rows (True: RoBERTa family), or
    with this many whatever the config says (MPNet: 2, its padding index is fixed at 1).
    `tensors`: further family-specific names and settings for its score module (a relative-bias table, the
    sinusoidal module and how it numbers positions, whose ALiBi slope code the family runs).
    `retrofit`: posprobe.retrofitting can install mechanisms into it. `rotary_class`: 'module:Class' of the
    family's own transformers rotary module (its rope initialisation gives the frequencies).
    `description`: for OTHER kinds, what the family uses instead (shown when an analysis refuses it).
    An entry without `word` is known (`params` counts it, analyses name its mechanism) but not analysed.
    """

    name: str
    model_types: tuple[str, ...]
    kind: str
    causal: bool = False
    word: str | None = None
    position: str | None = None
    token_type: str | None = None
    embedding_norm: str | None = None
    projection: str | None = None
    projection_first: bool = False
    embed_scale: str | None = None
    query: str | None = None
    key: str | None = None
    qkv: str = SEPARATE
    pre_norm: str | None = None
    qk_norm: tuple[str, str] | None = None
    norm: str = LAYERNORM
    eps: float | None = None  # the norm epsilon where the family fixes it in code, not in its config (DistilBERT)
    shared_layers: bool = False
    reserved_rows: bool | int = False
    encoder_decoder: bool = False
    retrofit: bool = False
    rotary_class: str | None = None
    scaling: str = "head_dim"  # q.k times d_h ** -0.5 ('head_dim'), 1 ('none': T5), or config[scaling] ** -0.5
    softcap: str | None = None  # config key of a logit soft cap: scores -> cap * tanh(scores / cap) (Gemma 2)
    tensors: dict[str, str] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        """A typo in an entry is an error at import, not a silently different computation."""
        checks = {
            "kind": (self.kind, KINDS),
            "norm": (self.norm, NORMS),
            "qkv": (self.qkv, (SEPARATE, GPT2_CONV1D, PER_HEAD, STACKED)),
            "embed_scale": (self.embed_scale, (None, "sqrt_hidden", "scale_embedding")),
        }
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"family '{self.name}': {name} {value!r} is not one of {allowed}")

    @property
    def analysable(self) -> bool:
        """True when posprobe computes this family's positional scores (a known kind with its tensors named)."""
        return self.kind != OTHER and self.word is not None

    @property
    def mechanism(self) -> str:
        """What the family uses for positions, in words."""
        return self.description or KIND_NAMES[self.kind]

    @property
    def learned_table(self) -> bool:
        """True when the checkpoint stores a learned absolute table E_P (also beside a relative bias: MPNet)."""
        return self.kind == LEARNED or (self.position is not None and self.kind not in TABLE_KINDS + (OTHER,))


_BERT = dict(
    word="embeddings.word_embeddings.weight",
    position="embeddings.position_embeddings.weight",
    token_type="embeddings.token_type_embeddings.weight",
    embedding_norm="embeddings.LayerNorm",
    query="encoder.layer.{l}.attention.self.query",
    key="encoder.layer.{l}.attention.self.key",
)
# Llama layout: model.embed_tokens, model.layers.{l}.input_layernorm, self_attn.q_proj / k_proj.
_LLAMA = dict(
    kind=ROTARY,
    causal=True,
    word="embed_tokens.weight",
    query="layers.{l}.self_attn.q_proj",
    key="layers.{l}.self_attn.k_proj",
    pre_norm="layers.{l}.input_layernorm",
    norm=RMSNORM,
)

# T5 layout: shared word table, {stack}.block.{l}.layer.0 = (pre-attention RMS norm, SelfAttention q/k, no bias).
_T5 = dict(
    kind=BUCKET_BIAS,
    encoder_decoder=True,
    word="shared.weight",
    query="{stack}.block.{l}.layer.0.SelfAttention.q",
    key="{stack}.block.{l}.layer.0.SelfAttention.k",
    pre_norm="{stack}.block.{l}.layer.0.layer_norm",
    norm=RMSNORM,
    scaling="none",  # T5 folds the scale into its weights: q.k is not divided by sqrt(d_kv)
)
_T5_BIAS = "{stack}.block.{l}.layer.0.SelfAttention.relative_attention_bias.weight"


_SEQ2SEQ = dict(
    word="shared.weight",
    eps=1e-5,  # nn.LayerNorm's default: their configs name no epsilon
    position="encoder.embed_positions.weight",  # stored by Marian / Pegasus; built when absent
    embed_scale="scale_embedding",
    query="encoder.layers.{l}.self_attn.q_proj",
    key="encoder.layers.{l}.self_attn.k_proj",
)


def _sinusoidal(module: str, prefix: str) -> dict[str, str]:
    return {"positions_class": f"transformers.models.{module}.modeling_{module}:{prefix}SinusoidalPositionalEmbedding"}


def _rotary(module: str, prefix: str) -> str:
    return f"transformers.models.{module}.modeling_{module}:{prefix}RotaryEmbedding"


FAMILIES: tuple[Family, ...] = (
    # -- learned absolute tables (SPEC §1-3)
    Family("bert", ("bert",), LEARNED, retrofit=True, **_BERT),
    Family("ernie", ("ernie",), LEARNED, **_BERT),
    Family("roberta", ("roberta", "xlm-roberta"), LEARNED, reserved_rows=True, retrofit=True, **_BERT),
    Family("camembert", ("camembert", "data2vec-text"), LEARNED, reserved_rows=True, **_BERT),
    Family("electra", ("electra",), LEARNED, projection="embeddings_project", retrofit=True, **_BERT),
    Family(
        "albert",
        ("albert",),
        LEARNED,
        word=_BERT["word"],
        position=_BERT["position"],
        token_type=_BERT["token_type"],
        embedding_norm=_BERT["embedding_norm"],
        projection="encoder.embedding_hidden_mapping_in",
        query="encoder.albert_layer_groups.0.albert_layers.0.attention.query",
        key="encoder.albert_layer_groups.0.albert_layers.0.attention.key",
        shared_layers=True,
        retrofit=True,
    ),
    Family(
        "distilbert",
        ("distilbert",),
        LEARNED,
        word=_BERT["word"],
        position=_BERT["position"],
        embedding_norm=_BERT["embedding_norm"],
        eps=1e-12,
        query="transformer.layer.{l}.attention.q_lin",
        key="transformer.layer.{l}.attention.k_lin",
    ),
    Family(
        "megatron-bert",
        ("megatron-bert",),
        LEARNED,
        word=_BERT["word"],
        position=_BERT["position"],
        token_type=_BERT["token_type"],
        query=_BERT["query"],
        key=_BERT["key"],
        pre_norm="encoder.layer.{l}.attention.ln",  # pre-LN: no embedding norm, one before each attention
    ),
    Family(
        "gpt2",
        ("gpt2",),
        LEARNED,
        causal=True,
        word="wte.weight",
        position="wpe.weight",
        query="h.{l}.attn.c_attn",
        key="h.{l}.attn.c_attn",
        qkv=GPT2_CONV1D,
        pre_norm="h.{l}.ln_1",
    ),
    # -- rotary (SPEC §9)
    Family("llama", ("llama",), rotary_class=_rotary("llama", "Llama"), **_LLAMA),
    Family("mistral", ("mistral",), rotary_class=_rotary("mistral", "Mistral"), **_LLAMA),
    Family("mixtral", ("mixtral",), rotary_class=_rotary("mixtral", "Mixtral"), **_LLAMA),
    Family("qwen2", ("qwen2",), rotary_class=_rotary("qwen2", "Qwen2"), **_LLAMA),
    Family(
        "qwen3",
        ("qwen3",),
        rotary_class=_rotary("qwen3", "Qwen3"),
        qk_norm=("layers.{l}.self_attn.q_norm", "layers.{l}.self_attn.k_norm"),
        **_LLAMA,
    ),
    Family(
        "gemma",
        ("gemma",),
        rotary_class=_rotary("gemma", "Gemma"),
        embed_scale="sqrt_hidden",
        **{**_LLAMA, "norm": RMSNORM_PLUS1},
    ),  # fmt: skip
    Family(
        "gemma2",
        ("gemma2",),
        rotary_class=_rotary("gemma2", "Gemma2"),
        embed_scale="sqrt_hidden",
        scaling="query_pre_attn_scalar",
        softcap="attn_logit_softcapping",
        **{**_LLAMA, "norm": RMSNORM_PLUS1},
    ),
    Family(
        "phi",
        ("phi",),
        rotary_class=_rotary("phi", "Phi"),
        qk_norm=("layers.{l}.self_attn.q_layernorm", "layers.{l}.self_attn.k_layernorm"),  # when qk_layernorm
        **{**_LLAMA, "norm": LAYERNORM},
    ),
    Family(
        "phi3",
        ("phi3",),
        rotary_class=_rotary("phi3", "Phi3"),
        **{**_LLAMA, "query": "layers.{l}.self_attn.qkv_proj", "key": "layers.{l}.self_attn.qkv_proj", "qkv": STACKED},
    ),
    Family(
        "starcoder2", ("starcoder2",), rotary_class=_rotary("starcoder2", "Starcoder2"), **{**_LLAMA, "norm": LAYERNORM}
    ),  # fmt: skip
    Family(
        "gpt_neox",
        ("gpt_neox",),
        ROTARY,
        causal=True,
        word="embed_in.weight",
        query="layers.{l}.attention.query_key_value",
        key="layers.{l}.attention.query_key_value",
        qkv=PER_HEAD,
        pre_norm="layers.{l}.input_layernorm",
        rotary_class=_rotary("gpt_neox", "GPTNeoX"),
    ),
    # -- sinusoidal absolute tables (built as the model builds them; encoder stack of encoder-decoders)
    Family("marian", ("marian",), SINUSOIDAL, **_SEQ2SEQ, tensors=_sinusoidal("marian", "Marian")),
    Family(
        "pegasus",
        ("pegasus",),
        SINUSOIDAL,
        pre_norm="encoder.layers.{l}.self_attn_layer_norm",
        **_SEQ2SEQ,
        tensors=_sinusoidal("pegasus", "Pegasus"),
    ),  # fmt: skip
    Family(
        "m2m_100",
        ("m2m_100",),
        SINUSOIDAL,
        pre_norm="encoder.layers.{l}.self_attn_layer_norm",
        **{**_SEQ2SEQ, "position": None},
        tensors=_sinusoidal("m2m_100", "M2M100"),
    ),  # fmt: skip
    Family(
        "xglm",
        ("xglm",),
        SINUSOIDAL,
        causal=True,
        word="embed_tokens.weight",
        embed_scale="scale_embedding",
        eps=1e-5,
        query="layers.{l}.self_attn.q_proj",
        key="layers.{l}.self_attn.k_proj",
        pre_norm="layers.{l}.self_attn_layer_norm",
        tensors={**_sinusoidal("xglm", "XGLM"), "positions_from": "position_ids"},
    ),
    # -- ALiBi
    Family(
        "bloom",
        ("bloom",),
        ALIBI,
        causal=True,
        word="word_embeddings.weight",
        embedding_norm="word_embeddings_layernorm",
        query="h.{l}.self_attention.query_key_value",
        key="h.{l}.self_attention.query_key_value",
        qkv=PER_HEAD,
        pre_norm="h.{l}.input_layernorm",
    ),
    Family(
        "mpt",
        ("mpt",),
        ALIBI,
        causal=True,
        word="wte.weight",
        query="blocks.{l}.attn.Wqkv",
        key="blocks.{l}.attn.Wqkv",
        qkv=STACKED,
        pre_norm="blocks.{l}.norm_1",
        tensors={"alibi": "build_mpt_alibi_tensor"},  # MPT's slope code (posprobe.families.alibi), not BLOOM's
    ),
    # -- bucketed relative bias (posprobe.families.relative_bias): 'relative_bias' names the (buckets, heads) table
    Family("t5", ("t5", "mt5"), tensors={"relative_bias": _T5_BIAS.replace("{l}", "0")}, **_T5),  # layer 0's, for all
    Family("umt5", ("umt5",), tensors={"relative_bias": _T5_BIAS}, **_T5),  # one table per layer
    Family(
        "mpnet",
        ("mpnet",),
        BUCKET_BIAS,
        word=_BERT["word"],
        position=_BERT["position"],  # and a learned absolute table (positions numbered from padding_idx + 1 = 2)
        embedding_norm=_BERT["embedding_norm"],
        query="encoder.layer.{l}.attention.attn.q",
        key="encoder.layer.{l}.attention.attn.k",
        reserved_rows=2,
        tensors={"relative_bias": "encoder.relative_attention_bias.weight"},
    ),
    # -- disentangled (posprobe.families.disentangled)
    Family(
        "deberta-v2",
        ("deberta-v2",),
        DISENTANGLED,
        word=_BERT["word"],
        token_type=_BERT["token_type"],
        embedding_norm=_BERT["embedding_norm"],
        projection="embeddings.embed_proj",
        projection_first=True,
        query="encoder.layer.{l}.attention.self.query_proj",
        key="encoder.layer.{l}.attention.self.key_proj",
        tensors={
            "position": _BERT["position"],  # read only when position_biased_input (not in v3)
            "rel_embeddings": "encoder.rel_embeddings.weight",
            "rel_norm": "encoder.LayerNorm",  # applied when norm_rel_ebd has 'layer_norm'
            "pos_query": "encoder.layer.{l}.attention.self.pos_query_proj",  # without share_att_key
            "pos_key": "encoder.layer.{l}.attention.self.pos_key_proj",
        },
    ),
    # -- known, not (yet) analysed
    Family(
        "longt5",
        ("longt5",),
        BUCKET_BIAS,
        encoder_decoder=True,
        description="relative position buckets with local / transient-global attention (not read yet)",
    ),
    Family(
        "deberta",
        ("deberta",),
        DISENTANGLED,
        description="disentangled relative positions (DeBERTa v1 layout, fused in_proj: not read yet)",
    ),  # fmt: skip
    Family("falcon", ("falcon",), OTHER, causal=True, description="rotary embeddings or ALiBi"),
    Family("speech_to_text", ("speech_to_text",), SINUSOIDAL),  # audio input: no word table to average
    Family(
        "longformer", ("longformer",), LEARNED, reserved_rows=True
    ),  # local attention windows: its scores are not read yet
    Family("gpt_neo", ("gpt_neo",), LEARNED, causal=True),  # unscaled, local attention: not read yet
    Family(
        "other-rotary",
        ("gptj", "olmo", "olmo2", "stablelm", "cohere", "gemma3", "qwen3_moe"),
        OTHER,
        causal=True,
        description="rotary embeddings (RoPE)",
    ),
    Family("other-rotary-encoder", ("roformer", "modernbert"), OTHER, description="rotary embeddings (RoPE)"),
    Family("xlm", ("xlm", "flaubert"), LEARNED),  # their own layouts: not read yet
    Family("xlnet", ("xlnet",), OTHER, description="sinusoidal relative positions"),
    Family("funnel", ("funnel",), OTHER, description="relative attention"),
    Family("reformer", ("reformer",), OTHER, description="axial position embeddings"),
)

_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
if len(_BY_TYPE) != sum(len(f.model_types) for f in FAMILIES):
    raise RuntimeError("a model type appears in two family entries")


def family_for_type(model_type: str) -> Family | None:
    """The entry of `model_type` (config.json's `model_type`), or None for a family posprobe does not know."""
    return _BY_TYPE.get(model_type)


def model_types(kind: str | None = None, analysable: bool | None = None, retrofit: bool | None = None) -> tuple:
    """Model types of the entries that match (`kind`; only analysable / retrofittable ones), in table order."""
    return tuple(
        t
        for f in FAMILIES
        if (kind is None or f.kind == kind)
        and (analysable is None or f.analysable == analysable)
        and (retrofit is None or f.retrofit == retrofit)
        for t in f.model_types
    )


def config_value(config: dict, what: str):
    """The first of `CONFIG_KEYS[what]` present (not None) in `config`, or None."""
    for key in CONFIG_KEYS[what]:
        if config.get(key) is not None:
            return config[key]
    return None


def table_model_types() -> tuple[str, ...]:
    """Model types with an absolute position table posprobe reads (learned, or sinusoidal as the model builds it)."""
    return tuple(t for kind in TABLE_KINDS for t in model_types(kind=kind, analysable=True))


def position_kind(config: dict) -> tuple[str, str]:
    """(kind, mechanism in words) of the model `config` describes, config switches included (DistilBERT's
    `sinusoidal_pos_embds`, BERT-style `position_embedding_type`, Falcon's `alibi`); OTHER for unknown types."""
    model_type = str(config.get("model_type", "unknown"))
    family = family_for_type(model_type)
    if family is None:
        return OTHER, f"unknown (posprobe does not know how '{model_type}' encodes positions)"
    if model_type == "distilbert" and config.get("sinusoidal_pos_embds"):
        return SINUSOIDAL, KIND_NAMES[SINUSOIDAL]
    pos_type = config.get("position_embedding_type", "absolute")
    if family.kind == LEARNED and pos_type not in (None, "absolute"):
        return OTHER, f"position_embedding_type='{pos_type}' (relative positions), not a learned absolute table"
    if family.kind == DISENTANGLED and not config.get("relative_attention", False):
        return OTHER, "content and a learned absolute table only (relative_attention off)"
    if model_type == "falcon":
        return (ALIBI, KIND_NAMES[ALIBI]) if config.get("alibi") else (ROTARY, KIND_NAMES[ROTARY])
    return family.kind, family.mechanism


def families_markdown() -> str:
    """The README's table of families (tests/test_family_table.py checks that the README holds exactly this)."""
    rows = [
        "| family | model types | positions | causal | posprobe computes |",
        "|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        if not f.analysable:
            does = "named in messages; `params`" + (" counts its table" if f.learned_table else "")
        elif f.kind in TABLE_KINDS:
            does = "`toeplitz`, `fhat`, `profiles`, `fit-tisa`, `compare`" + (", `retrofit`" if f.retrofit else "")
        else:
            does = "`fhat`, `profiles`, `fit-tisa`, `compare` (content-free scores)"
            does = ("`toeplitz` (its table), " if f.learned_table else "") + does  # MPNet: a table beside its bias
        types = ", ".join(f"`{t}`" for t in f.model_types)
        causal = "yes" if f.causal else ("decoder" if f.encoder_decoder else "no")
        rows.append(f"| {f.name} | {types} | {f.mechanism} | {causal} | {does} |")
    return "\n".join(rows)
