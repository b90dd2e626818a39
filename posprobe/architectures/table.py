"""The family table: one entry per transformers model family, the one place posprobe's family knowledge lives.

An entry (`Family`) says how a family encodes position (`kind`, one of `KINDS`), whether its attention is causal,
where its tensors live and how to read them. Tensor names are *suffixes* (a task-head prefix such as 'bert.' or
'model.' does not matter); per-layer names hold `{l}` (the layer) and, for encoder-decoder families, `{stack}`
('encoder' or 'decoder'). Sizes come from config.json under any of the names in `CONFIG_KEYS`. Config switches that
change how a family reads (ESM's rotary, Falcon's layouts, DeBERTa without relative attention, ...) are decided
here too (`position_kind`, `has_learned_table`, `qkv_layout`, `switched_on`): the only place that names model types.

Who reads it: `posprobe.families.context` (the one model reader: tensors, layouts, norms, what is analysable;
with `embeddings`, `layouts` and `windows`) and the score modules (`context.SCORE_MODULES`, one per kind: SPEC
§3, §9), `posprobe.analysis.params` (which families have a learned table), `posprobe.retrofitting.install`
(`retrofit=True` entries), `posprobe.architectures.config` (which configs are checked in depth), the tests (one tiny
config per entry) and the docs' table of families (docs/families.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Position mechanism kinds (SPEC §1, §9); `posprobe.families.context.SCORE_MODULES` computes each kind's scores.
LEARNED = "learned"  # learned absolute table E_P (SPEC §1-3)
SINUSOIDAL = "sinusoidal"  # fixed sin/cos absolute table, built as the model builds it
ROTARY = "rotary"  # RoPE on q and k
BUCKET_BIAS = "bucket_bias"  # learned bias[h, bucket(j - i)] (T5, MPNet)
ALIBI = "alibi"  # -m_h |j - i|
DISENTANGLED = "disentangled"  # DeBERTa-v2 c2p + p2c
NOPE = "nope"  # no positional term in any attention layer (Jamba: its Mamba layers carry position)
RELATIVE_LOGITS = "relative_logits"  # per-distance bias mixed by each query's hidden state, convolved keys (Inkling)
RELATIVE_SINUSOIDAL = "relative_sinusoidal"  # (q + u).k + (q + v).W_R R(i - j), R sinusoidal (XLNet; Transformer-XL)
OTHER = "other"  # known, not analysed (see `Family.description`)
KINDS = (LEARNED, SINUSOIDAL, ROTARY, BUCKET_BIAS, ALIBI, DISENTANGLED, NOPE, RELATIVE_LOGITS, RELATIVE_SINUSOIDAL,
         OTHER)  # fmt: skip
TABLE_KINDS = (LEARNED, SINUSOIDAL)  # an absolute table E_P exists (stored or built): sections 1-3 of SPEC apply
KIND_NAMES = {
    LEARNED: "learned absolute table",
    SINUSOIDAL: "sinusoidal absolute positions (not learned)",
    ROTARY: "rotary embeddings (RoPE)",
    BUCKET_BIAS: "relative position buckets (learned bias)",
    ALIBI: "ALiBi attention biases",
    DISENTANGLED: "disentangled relative positions",
    NOPE: "no positional encoding in attention (NoPE)",
    RELATIVE_LOGITS: "relative logits conditioned on the hidden state (a learned bank of per-distance profiles)",
    RELATIVE_SINUSOIDAL: "sinusoidal relative positions (projected per layer, with learned biases)",
}
# How Q/K weights are stored (`Family.qkv`).
SEPARATE = "separate"  # Linear q and k: weight (H*d_h, d), q = x @ W.T + b
GPT2_CONV1D = "gpt2-conv1d"  # one Conv1D: weight (d, 3d) = [q | k | v] columns, y = x @ W + b
PER_HEAD = "per-head"  # one Linear (3d, d) whose rows are grouped per head: [q_h; k_h; v_h] (GPT-NeoX, BLOOM)
STACKED = "stacked"  # one Linear whose rows are [q (H*d_h); k (H_kv*d_h); v (H_kv*d_h)] (Phi-3)
KV_GROUPED = "kv-grouped"  # one Linear, per key head g: [q of its H/H_kv query heads; k_g; v_g] (Falcon's new layout)
BLOCKED = "blocked"  # one Linear in `Family.qkv_blocks` equal row blocks, each [q; v; k] slices (CodeGen, mp_num 4)
GROUPED_CONV = "grouped-conv1d"  # kernel-1 Conv1d q and k with groups: weight (out, in / groups, 1) (SqueezeBERT)
LATENT = "latent"  # multi-head latent attention: rotary and position-free parts (DeepSeek V2 / V3; families.latent)
GATED_QUERY = "gated-query"  # separate Linears; q's rows per head [q_h (d_h); output gate_h (d_h)] (Qwen3-Next)
ROUTED_QUERY = "routed-query"  # query experts (E, H_kv d_h, d) picked per token by a router; keys shared (JetMoE)
HEAD_TENSOR = "head-tensor"  # q and k are parameters (d, H, d_h) themselves, no '.weight', no bias (XLNet)
CCA = "cca"  # separate Linears, then causal convolutions along the sequence (ZAYA; families.convolutional)
SHARED_KV = "shared-kv"  # a query LoRA with a weightless per-head norm, one key-value head, rotary on each head's
# trailing dims (DeepSeek V4; families.shared_kv)
QKV_LAYOUTS = (SEPARATE, GPT2_CONV1D, PER_HEAD, STACKED, KV_GROUPED, BLOCKED, GROUPED_CONV, LATENT, GATED_QUERY,
               ROUTED_QUERY, HEAD_TENSOR, CCA, SHARED_KV)  # fmt: skip
# How a rotary family pairs the rotated dims and where its angles come from (`Family.rotary_layout`).
ROTATE_HALF = "rotate-half"  # the rotary module's (cos, sin), each (n, r); dim i pairs with i + r/2 (Llama)
INTERLEAVED = "interleaved"  # the module's (cos, sin), each (n, r) repeated per pair; dims 2i, 2i+1 pair (Cohere)
HALF_INTERLEAVED = "half-interleaved"  # the first half of the module's (cos, sin), each repeated twice; 2i, 2i+1 (GLM)
SIN_COS_PAIRS = "sin-cos-pairs"  # the module gives (sin, cos), each (n, r/2) per pair; dims 2i, 2i+1 (GPT-J, CodeGen)
SIN_COS_TABLE = "sin-cos-table"  # a table (n, d_h) of [sin | cos] per pair (stored or built); 2i, 2i+1 (RoFormer)
HALF_ANGLES = "half-angles"  # the module's (cos, sin), each (n, r/2), one column per pair; dim i pairs with i + r/2
COMPLEX = "complex"  # the module gives complex e^{i angle}, (n, r/2), one per pair; dims 2i, 2i+1 (DeepSeek V2)
REVERSED = "reversed"  # rotate_half with flipped signs: the rotation runs the other way, angle -> -angle (NanoChat)
ROTARY_LAYOUTS = (ROTATE_HALF, INTERLEAVED, HALF_INTERLEAVED, SIN_COS_PAIRS, SIN_COS_TABLE, HALF_ANGLES, COMPLEX,
                  REVERSED)  # fmt: skip
# Which layers of a rotary family apply no rotary embedding at all (`Family.nope`: NoPE layers, SPEC §9).
NOPE_RULES = (
    "no_rope_layers",  # config.no_rope_layers[l] == 0: layer l is NoPE (SmolLM3, Llama 4)
    "global_layers",  # layers whose config.layer_types[l] is not 'sliding_attention' are NoPE (Cohere 2; all
    # layers when config.sliding_window is None)
    "global_layers_if_windowed",  # the same while config.sliding_window is set; every layer rotates without (Exaone 4)
    "global_layers_by_type",  # layers whose config.layer_types[l] is not 'sliding_attention', any window (AFMoE)
    "global_layers_but_dense_prefix",  # global_layers, except dense-MLP prefix layers where the config's
    # prefix_dense_sliding_window_pattern is 1: those rotate (Cohere 2 MoE's force_rope)
    "zero_rope_theta",  # layers whose rope base in config[tensors['layer_rope_theta']] is 0 (Granite SWA)
    "untyped_rope",  # layers whose type has no rope parameters (config.rope_parameters[type] null: Cohere Compass)
)
# Which layers attend locally and how far (`Family.windows`; posprobe.families.windows reads them).
WINDOW_RULES = (
    "sliding_window",  # config.sliding_window (when set) for every layer, causal: keys i - w < j <= i (Mistral)
    "layer_types",  # config.layer_types[l] == 'sliding_attention' (ZAYA: 'hybrid_sliding') layers see
    # |j - i| < config.sliding_window (Gemma);
    # 'chunked_attention' layers the keys of the query's own chunk of config.attention_chunk_size (Llama 4)
    "layer_types_inclusive",  # the same with |j - i| <= config.sliding_window (ModernBERT: local_attention / 2)
    "attention_layers",  # config.attention_layers[l] == 'local': causal window config.window_size (GPT-Neo)
    "attention_window",  # config.attention_window (per layer or one), |j - i| <= w / 2 (Longformer)
    "block_sparse",  # config.attention_type 'block_sparse': full attention up to (5 + 2 r) blocks, then sparse
    "local_radius",  # encoder stack: |j - i| <= config.local_radius (LongT5); decoder: full
    "per_layer_config",  # config.per_layer_config[l].sliding_window, when set: |j - i| <= it (NeoMME); else full
    "neighbour_chunks",  # config.attn_layers[l] 'local': the query's chunk of local_attn_chunk_length and
    # local_num_chunks_before / _after neighbour chunks, wrapping around, after padding (Reformer; windows)
    "stack_window",  # config[tensors['window']] (when set) in the stacks over the text's positions, causal: keys
    # i - w < j <= i (BLT's byte encoder and decoder, `Family.stacks`)
)
# config.layer_types values of softmax-attention layers ('local': Reformer's attn_layers); a hybrid's other layers
# (`Family.hybrid`) have none.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "attention", "hybrid",
                         "indexed_attention", "local")  # fmt: skip
# How `posprobe attention` records a family's attention (`Family.capture`; posprobe.capture picks the route from the
# model class at run time, and tests/test_capture_families.py checks that each tested family takes the route named
# here). An encoder-decoder runs its encoder stack.
INTERFACE = "interface"  # through transformers' AttentionInterface: posprobe's recording attention function
EAGER = "eager"  # the family's own eager attention: its returned attentions and the inputs of its softmax
# (neighbour-chunk layers, `windows` 'neighbour_chunks': their per-chunk attention rebuilt, posprobe.capture.chunks)
REFUSED = "refused"  # no (queries x keys) softmax per layer to record; `capture_note` says why
HYBRID_CAPTURE = "attention layers only; the others listed: no positional score"  # a hybrid's `capture_note`
CAPTURES = (INTERFACE, EAGER, REFUSED)
# Norms (`Family.norm`): the layer norm applied before attention (and to the embeddings, where there is one).
LAYERNORM = "layernorm"  # (x - mean) / sqrt(var + eps) * w + b (b optional)
RMSNORM = "rmsnorm"  # x / sqrt(mean(x^2) + eps) * w
RMSNORM_PLUS1 = "rmsnorm+1"  # Gemma: x / sqrt(mean(x^2) + eps) * (1 + w)
LAYERNORM_PLUS1 = "layernorm+1"  # Nemotron's LayerNorm1P: (x - mean) / sqrt(var + eps) * (1 + w) + b
PLAIN_LAYERNORM = "layernorm-plain"  # OLMo: (x - mean) / sqrt(var + eps), no weights stored
PLAIN_RMSNORM = "rmsnorm-plain"  # NanoChat: x / sqrt(mean(x^2) + eps), no weights stored
NONORM = "nonorm"  # MobileBERT's NoNorm: x * w + b (no normalisation)
PLAIN_L2 = "l2-plain"  # Dory (nGPT): x / sqrt(sum(x^2) + eps), onto the unit sphere, no weights stored
NORMS = (LAYERNORM, RMSNORM, RMSNORM_PLUS1, LAYERNORM_PLUS1, PLAIN_LAYERNORM, PLAIN_RMSNORM, NONORM, PLAIN_L2)

# Config field names, in the order they are looked for.
CONFIG_KEYS = {
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads", "attention_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "attn_config.kv_n_heads"),  # dotted: nested
    "layers": (
        "layers_block_type",
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "encoder_layers",
        "block_sizes.0",
    ),
    # (a list counts its entries: Nemotron-H's layers_block_type, one kind per layer, overrides num_hidden_layers;
    # Funnel: the layers of its first block, the ones at full length)
    "hidden": ("hidden_size", "n_embd", "dim", "d_model", "emb_dim"),
    "head_dim": ("head_dim", "d_kv", "dim_head", "attention_head_dim", "kv_channels"),  # CPM-Ant, Zamba, Beam
    "positions": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
    "vocab": ("vocab_size", "n_vocab"),
    "eps": (
        "layer_norm_eps",
        "layer_norm_epsilon",
        "rms_norm_eps",
        "layernorm_epsilon",
        "norm_epsilon",
        "norm_eps",
        "eps",
    ),  # CPM-Ant: eps
    "attention_width": ("true_hidden_size", "attention_hidden_size"),  # the width Q/K read where it is not the
    # hidden size (MobileBERT's bottleneck; Zamba's [hidden; embeddings])
    "latent_head_dim": ("qk_nope_head_dim",),  # MLA: position-free dims of each head's q and k
    "latent_rope_dim": ("qk_rope_head_dim",),  # MLA: rotary dims of each head's q and k
}


# How each table field reads a config switch (`Family.switches`): a field listed there applies only when the config
# key is true (missing keys take the default of the family's transformers config class).
SWITCHABLE = ("pre_norm", "embedding_norm", "qk_norm", "position", "trigram", "rotary_layout", "word_projection")
EMBED_SCALES = (None, "sqrt_hidden", "scale_embedding", "rescale_embeddings", "token_dropout", "embedding_multiplier",
                "mup_enabled", "scale_emb", "sqrt_hidden_bf16", "embedding_scale")  # fmt: skip


@dataclass(frozen=True)
class Family:
    """One model family. Only `name`, `model_types` and `kind` are required; the rest say where tensors live.

    Embedding level: `word` (vocabulary table), `position` (learned or stored table), `token_type`,
    `constant_rows` (further tables whose row 0 every token adds: LayoutLM's 2-D box tables at box 0),
    `embedding_norm` (norm of the summed embeddings, prefix), `projection` (factorised embeddings, prefix;
    applied after the embedding norm, or before it with `projection_first`: DeBERTa's embed_proj),
    `word_projection` (a Linear applied to the word embedding alone, before positions are added: OPT's
    project_in, MobileBERT's embedding_transformation; with the `trigram` switch it reads [next; this; previous]
    word embeddings, zeros beyond the sequence; `word_concat`: (config key, table) pairs whose row 0 is concatenated
    after the word embedding, where the key is true, before the projection reads it: RoCBert's shape and
    pronunciation embeddings at id 0, the ids its module takes when a text gives none), `embed_scale`
    ('sqrt_hidden': the embeddings are multiplied by sqrt(d) in the table's dtype, Gemma; 'sqrt_hidden_bf16': by
    sqrt(d) rounded to bfloat16, RecurrentGemma;
    'scale_embedding' / 'rescale_embeddings' / 'mup_enabled' (AFMoE): by sqrt(d) when that config key is true;
    'token_dropout': ESM's 1 - 0.15 * 0.8 when config.token_dropout;
    'embedding_multiplier' / 'scale_emb' / 'embedding_scale': that config value, Granite / MiniCPM 3 / HRM).
    `position_offset`: position i reads table row i + offset, and the table holds max_position_embeddings + offset
    rows (OPT, BART, mBART, BioGPT: 2); `position_width`: config keys of the position table's width (default:
    `embedding_size`, else the hidden size).
    Attention of layer `{l}`: `query` / `key` prefixes ('.weight', '.bias' appended; with `qkv` != SEPARATE
    `query` names the fused projection, unless `query` and `key` find two tensors: a model transformers loaded
    from fused files splits them, GTE, Nomic BERT; `qkv_blocks` for BLOCKED), `pre_norm` (the norm applied to the layer
    input before attention; from layer `pre_norm_from` on: ModernBERT's layer 0 has none), `bottleneck`
    ((config keys, prefix) alternatives: the first whose keys are all true names a Linear `prefix.dense` and norm
    `prefix.LayerNorm` the layer input goes through before Q/K: MobileBERT), `qk_norm` (prefixes of norms applied
    to q and k before the positional mechanism where the checkpoint has them; `qk_norm_scope` 'head': over each
    head's d_h (Qwen3, Cohere, StableLM: one weight per head where stored so, a '{h}' in the prefix naming
    per-head modules), 'all': over the whole projection before the head split (OLMo-2); after the rotation with
    `qk_norm_after_rotary`: Hunyuan), `clip` (config key of a clamp of q and k: OLMo's clip_qkv, DBRX's
    attn_config.clip_qkv), `norm` (the kind of every norm above), `shared_layers` (ALBERT: one stored layer at
    every depth), `sublayers` (LongCat-Flash: two attention sublayers per stored layer, each a layer here), `cycles`
    (HRM: stacks run in cycles, '{m}' names the stack a depth runs), `stacks` (BLT: stacks run one after another,
    '{m}' the module of a depth's stack; `tensors['stack_rotary']` each stack's own rotary module class,
    `tensors['window']` the config key of its byte stacks' causal window, `tensors['hash_words']` /
    `['hash_vocab']` its hashed n-gram tables (one fused table of equal slices) and the config key of a slice's rows,
    each slice's average row added to the average word). A name
    may hold groups of alternatives, 'a.(b|c).(d|e)': the first combination the checkpoint holds.
    `switches`: field -> config key; the field (one of `SWITCHABLE`) applies only when the key is true (XMOD's
    pre_norm, OPT's do_layer_norm_before, ESM's emb_layer_norm_before, DeBERTa's position_biased_input).
    `reserved_rows`: the position table starts with pad_token_id + 1 reserved rows (True: RoBERTa family), or
    with this many whatever the config says (MPNet: 2, its padding index is fixed at 1).
    `tensors`: further family-specific names and settings for its score module (a relative-bias table, the
    sinusoidal module and how it numbers positions, whose ALiBi slope code the family runs; issue 34's attention
    variants: 'layer_rope_theta' a config list of rope bases per layer (Granite SWA), 'sliding_kv_factor' the key
    heads of sliding layers per config key head (MiMo-V2-Flash), 'router' the query experts' router (JetMoE),
    'value' / 'dt_proj' / 'dt_scale' the dynamic mask's tensors (Doge), 'unit_qk' / 'query_channel_scale' /
    'mlp_layer_entries' Dory's unit-norm q and k, per-channel query scale and config layout, 'nope_query_scale'
    the family's own function of the positions that scales a NoPE layer's query (Beam); 'more_words' the words
    the word table holds beyond vocab_size, averaged with the others (Moshi's 1, Mllama's 8);
    'query_heads_per_layer' a config list of each layer's query-head count (Laguna: H is the largest, SPEC §9);
    'stream_mix' the module of a layer's gated mix of hyper-connection streams (Qwen4-Exp: `families.stream_mix`),
    'indexer_blocks' 'mean' for an indexer that scores mean-pooled key blocks (`families.pooled_blocks`),
    'rope_types' the rope-parameter key each layer type reads, where they are not keyed by layer type (DeepSeek V4:
    'sliding_attention:main,*:compress'), 'pooled_keys' the config dict of the block sizes of layer types that append
    entries pooled over blocks of tokens after their keys (DeepSeek V4's compress_rates: not in F̂, SPEC §9),
    Reformer's 'axial_factors' its axial factor tables ('{a}' the axis) used where config 'axial_switch' is true,
    'axial_parameters' the config lists of their rows and widths (its learned table holds sum rows x width),
    'layer_types' the config list of its layer types, 'unscored_softmax_layers' those types whose softmax attends
    pairs its input's content picks (no positional score), 'causal_when' the config key without which it is not
    causal; 'relative_bias_projection' a Linear per layer whose output on a query's input is its bias per bucket,
    'num_buckets' / 'max_distance' the config keys of its buckets: ProphetNet's decoder; issue 44: 'global_scale'
    the config key of a factor on the logits of its layers other than sliding ones (Ergo's global_attention_scale);
    Kolibri 1.1's 'indexer_picks' 'sinks_local_topk' (a weightless indexer: `families.sink_local`), 'key_rounding'
    the family's function rounding the keys its indexed layers attend, 'kv_sources' the config list of each layer's
    key-value source layer (`families.kv_sharing`)).
    `retrofit`: posprobe.retrofitting.install can install mechanisms into it, at the attention module that owns
    `query`, `key` and `value` (the value projection, named for retrofit alone); with `shared_layers`,
    `layer_groups` = (the attention module of group `{g}`, inner layer `{j}`; the config keys of the group count
    and of the layers per group): depth i runs group i // (L / groups), every inner layer in turn.
    `rotary_class`: 'module:Class' of the family's own transformers rotary module (its rope initialisation gives
    the frequencies), `rotary_layout`
    how its angles pair the dims (`ROTARY_LAYOUTS`). `switch_kinds`: further kinds a config switch selects
    (`position_kind` says which: ESM's rotary, Falcon's ALiBi, a DeBERTa without relative attention).
    `windows`: how the config says which layers attend locally (`WINDOW_RULES`); `bidirectional`: config key
    that makes a causal family attend both ways (Gemma 3's use_bidirectional_attention).
    `description`: what the family uses for positions where `KIND_NAMES` does not say it all.
    The newest designs (issue 34): `nope` how the config names NoPE layers (`NOPE_RULES`), `sinks` the per-head
    learned sink logits (gpt-oss), `hybrid` what a hybrid's layers without softmax attention are (config.layer_types
    names them), `softmax_attention` False for models with none at all (refused), `qkv` LATENT for multi-head latent
    attention (`families.latent`), ROUTED_QUERY for a mixture of attention heads (`families.routed`: `query` the
    query experts, `tensors['router']` their router, `key` the shared [k; v] projection), SHARED_KV for a query
    LoRA beside one key-value head (`families.shared_kv`), `indexer` the module of a sparse indexed layer's indexer
    (DeepSeek Sparse Attention: it picks each query's top-k keys; `families.indexed`, its rotary pairing in
    `tensors['indexer_rotary']`); `sizes` config keys of the read stack's sizes, looked for first (Whisper's
    decoder_layers), `text_stack` the stack of an encoder-decoder that reads text ('decoder' where
    the encoder reads audio: the entry names the decoder's tensors, and captures run it);
    `tensors['codebook_words']` one word table per codebook ('{c}'), summed (MusicGen); `decoder_stack` the fields
    a decoder whose names, sizes or mechanism differ from the encoder's is read with (`--stack decoder`:
    BigBird-Pegasus, ProphetNet's main stream, Funnel's upsampling decoder; `stack_family`).
    A multimodal wrapper (`language_model`, made by `_wrapper`) is read as its language model: (the config key of
    the nested config, the module name its tensors are under, the model type that nested config has); its entry is
    that language model's entry under the wrapper's name and types (`posprobe.families.language_model`); with
    `language_model_alone` (why transformers cannot build or run the wrapper on text) texts run that language model
    alone. `draft_of`: a draft model for assisted decoding that attends that model's keys and values (refused).
    An entry without `word` is known (`params` counts it, analyses name its mechanism) but not analysed.
    """

    name: str
    model_types: tuple[str, ...]
    kind: str
    causal: bool = False
    word: str | None = None
    position: str | None = None
    token_type: str | None = None
    constant_rows: tuple[str, ...] = ()
    embedding_norm: str | None = None
    projection: str | None = None
    projection_first: bool = False
    word_projection: str | None = None
    word_concat: tuple[tuple[str, str], ...] = ()
    extra_word_rows: tuple[str, ...] = ()  # config keys whose product counts rows after the vocabulary in the word
    # table, which are no words (CPM-Ant's prompt embeddings): e_w averages the vocabulary rows alone
    token_type_row: int = 0  # the row of `token_type` every text token adds (CPM-Ant's segment 2)
    embed_scale: str | None = None
    position_offset: int = 0
    position_width: tuple[str, ...] = ("embedding_size",)
    query: str | None = None
    key: str | None = None
    value: str | None = None
    qkv: str = SEPARATE
    qkv_blocks: int = 1
    pre_norm: str | None = None
    pre_norm_from: int = 0
    bottleneck: tuple[tuple[tuple[str, ...], str], ...] = ()
    qk_norm: tuple[str, str] | None = None
    qk_norm_scope: str = "head"
    qk_norm_after_rotary: bool = False  # the q/k norms act on the rotated q and k (Hunyuan), not before RoPE
    clip: str | None = None
    norm: str = LAYERNORM
    eps: float | None = None  # the norm epsilon the family fixes in code, whatever its config says (DistilBERT, BioGPT)
    shared_layers: bool = False
    layer_groups: tuple[str, str, str] | None = None
    cycles: tuple[str, str] | None = None  # (config key of the layers per stack, of the low cycles): the stacks run
    # in cycles, L_cycles low-stack passes then one high-stack pass, H_cycles times (HRM); depth l (the model's own
    # numbering: num_hidden_layers = layers per stack x H_cycles x (L_cycles + 1)) runs stored layer l % k of the
    # low stack ('{m}' = 'L') or the high one ('H')
    stacks: tuple[tuple[str, str, bool], ...] = ()  # (module, config section, whether its positions are the text's)
    # of stacks run one after another (BLT: byte encoder, global transformer over patches, byte decoder): depth l runs
    # stored layer l - (the layers of the stacks before) of its stack ('{m}' its module), `stack_depths`; a stack over
    # other positions (BLT's patches) is a hybrid's other layers, no positional score (`families.stacked`)
    sublayers: int = 1  # attention sublayers per stored layer (LongCat-Flash: 2; names hold '{s}'): posprobe's layer
    # l is sublayer l % sublayers of stored layer l // sublayers, as transformers numbers them; config.num_layers
    # counts the stored layers
    reserved_rows: bool | int = False
    encoder_decoder: bool = False
    retrofit: bool = False
    rotary_class: str | None = None
    rotary_layout: str = ROTATE_HALF
    switch_kinds: tuple[str, ...] = ()
    switches: dict[str, str] = field(default_factory=dict)
    windows: str | None = None
    nope: str | None = None  # how the config names its NoPE layers (`NOPE_RULES`), for rotary families
    sinks: str | None = None  # per-head learned sink logits s_h (one extra softmax column, no value): gpt-oss
    indexer: str | None = None  # prefix of layer {l}'s top-k indexer (DeepSeek Sparse Attention, families.indexed)
    rms_when: str | None = None  # config key that, when set, makes every norm an RMS norm with it as epsilon
    # (Cohere 2 MoE's rms_norm_eps; its bias-free LayerNorm otherwise)
    softmax_attention: bool = True  # False: no layer has softmax attention (Mamba, RWKV, xLSTM): refused as such
    draft_of: str = ""  # a draft model for assisted decoding whose attention reads another model's keys and values:
    # that model's type (analysed instead); the draft is refused in one line, its `description` saying why
    sizes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # `CONFIG_KEYS` entry -> config keys looked
    # for first: the stack posprobe reads has sizes of its own (Whisper's decoder_layers, decoder_attention_heads)
    text_stack: str = "encoder"  # the stack of an encoder-decoder that reads text and that a capture runs: 'decoder'
    # where the encoder reads other inputs (Whisper's audio features); the entry then names the decoder's tensors
    decoder_stack: dict = field(default_factory=dict)  # a model whose decoder differs from its encoder in names,
    # sizes or mechanism (BigBird-Pegasus, ProphetNet; Funnel's upsampling decoder): the fields the entry takes for
    # `--stack decoder` (`stack_family`; causal unless they say otherwise, its own position table where named)
    hybrid: str = ""  # what the layers without softmax attention are, in words (config.layer_types names them;
    # `ATTENTION_LAYER_TYPES` are the attention layers): Jamba's Mamba, LFM2's short convolutions, ...
    bidirectional: str | None = None
    reads_padding: bool = False  # its outputs on real tokens depend on the padding beside them (ConvBERT's span
    # convolutions mask none; CPM-Ant masks as if padded on the left): its texts run one at a time (posprobe.capture)
    head_ratio: str | None = None  # config key of a mixed attention's ratio (ConvBERT): heads // ratio softmax q.k
    # heads (at least one), each of d / (2 H'), beside as many span-based dynamic-convolution heads (no score)
    hybrid_layers: str | None = None  # config key listing a hybrid's other layers by index, where no
    # config.layer_types names them (Mllama's cross_attention_layers; `layer_types`)
    language_model: tuple[str, str, str] | None = None  # a wrapper: (config key, module name, model type) of its
    # language model, e.g. ('text_config', 'language_model', 'gemma3_text')
    language_model_alone: str = ""  # a wrapper that transformers cannot build or run on text, in words (Gemma 3n's
    # timm vision tower, Llama 4's forward): texts run its language model alone, built from the nested config and
    # the tensors under its module (`families.language_model.alone_loading`, `capture.model.stack_to_run`)
    towers: tuple[str, ...] = ()  # a wrapper's other modules, as saved and as loaded, where its files keep the
    # language model at the top level, under no module of its own (Dots3): its reader then sees every name outside them
    scaling: str = "head_dim"  # q.k times: 'head_dim' d_h ** -0.5, 'none' 1 (T5, GPT-Neo), 'rsqrt:KEY' config[KEY]
    # ** -0.5 (Gemma 2), 'half_head_dim' (d_h / 2) ** -0.5 (Zamba), 'value:KEY' config[KEY] (Granite),
    # 'head_dim_if:KEY' d_h ** -0.5 when config KEY, else 1 (GPT-BigCode's scale_attn_weights), 'disentangled'
    # (DeBERTa's sqrt(d_h * terms) in float32),
    # 'latent' (MLA: the module's own yarn_apply_mscale, `families.latent`)
    softcap: str | None = None  # config key of a logit soft cap: scores -> cap * tanh(scores / cap) (Gemma 2)
    tensors: dict[str, str] = field(default_factory=dict)
    capture: str = INTERFACE  # how `attention` records it (`CAPTURES`; tested for analysable families)
    capture_note: str = ""
    description: str = ""

    def __post_init__(self):
        """A typo in an entry is an error at import, not a silently different computation."""
        checks = {
            "kind": (self.kind, KINDS),
            "norm": (self.norm, NORMS),
            "qkv": (self.qkv, QKV_LAYOUTS),
            "embed_scale": (self.embed_scale, EMBED_SCALES),
            "rotary_layout": (self.rotary_layout, ROTARY_LAYOUTS),
            "windows": (self.windows, (None, *WINDOW_RULES)),
            "nope": (self.nope, (None, *NOPE_RULES)),
            "qk_norm_scope": (self.qk_norm_scope, ("head", "all")),
            "capture": (self.capture, CAPTURES),
            "text_stack": (self.text_stack, ("encoder", "decoder")),
        }
        checks |= {f"sizes key {k!r}": (k, tuple(CONFIG_KEYS)) for k in self.sizes}
        checks |= {f"switches key {k!r}": (k, SWITCHABLE) for k in self.switches}
        checks |= {f"switch kind {k!r}": (k, KINDS) for k in self.switch_kinds}
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"family '{self.name}': {name} {value!r} is not one of {allowed}")
        if self.decoder_stack:  # the decoder's fields are checked as the entry they make (`stack_family`)
            replace(self, **{**self.decoder_stack, "decoder_stack": {}})
        if not (
            self.scaling in ("head_dim", "half_head_dim", "none", "disentangled", "latent")
            or self.scaling.startswith(("rsqrt:", "value:", "head_dim_if:"))
        ):
            raise ValueError(f"family '{self.name}': scaling {self.scaling!r} is not one of head_dim, half_head_dim, "
                             "none, disentangled, latent, rsqrt:KEY, value:KEY, head_dim_if:KEY")  # fmt: skip

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind the family can take (its own, then those a config switch selects)."""
        return (self.kind, *self.switch_kinds)

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
        """True when the family's checkpoints may store a learned absolute table E_P (also beside a relative bias:
        MPNet; `has_learned_table` says whether one config's does)."""
        return LEARNED in self.kinds or (self.position is not None and self.kind not in TABLE_KINDS + (OTHER,))


_BERT = dict(
    word="embeddings.word_embeddings.weight",
    position="embeddings.position_embeddings.weight",
    token_type="embeddings.token_type_embeddings.weight",
    embedding_norm="embeddings.LayerNorm",
    query="encoder.layer.{l}.attention.self.query",
    key="encoder.layer.{l}.attention.self.key",
    value="encoder.layer.{l}.attention.self.value",
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
_QK_NORM = ("layers.{l}.self_attn.q_norm", "layers.{l}.self_attn.k_norm")
_QK_LAYERNORM = ("layers.{l}.self_attn.q_layernorm", "layers.{l}.self_attn.k_layernorm")
_QK_AFTER_ROPE = ("layers.{l}.self_attn.query_layernorm", "layers.{l}.self_attn.key_layernorm")
# Gemma 4: Gemma 3n's attention without AltUp; global layers with a head size (and key heads) of their own
_GEMMA4_ENTRY = dict(
    embed_scale="sqrt_hidden",
    scaling="none",
    qk_norm=_QK_NORM,
    windows="layer_types",
    tensors={"kv_sharing": "kv_sharing_modes", "per_layer_heads": "per_layer_config"},
    **_LLAMA,  # its norms multiply by w (not 1 + w)
)
_GEMMA4 = (
    "rotary embeddings (RoPE), a setting and a head size per layer type; the last num_kv_shared_layers layers "
    "attend to an earlier layer's keys"
)
_DRAFT = (
    "a draft model for assisted decoding: every layer has queries only and attends the keys and values of its "
    "backbone's last full and sliding layers (shared_kv_states), its input the backbone's last hidden state beside "
    "the token's embedding; refused on its own: analyse the backbone ({})"
)
_GRANITE = dict(scaling="value:attention_multiplier", embed_scale="embedding_multiplier")

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
    capture=EAGER,
    capture_note="encoder stack",
)
_T5_BIAS = "{stack}.block.{l}.layer.0.SelfAttention.relative_attention_bias.weight"
# LongT5's encoder names its attention after its kind; its decoder is T5's.
_LONGT5_ATTENTION = "(SelfAttention|LocalSelfAttention|TransientGlobalSelfAttention)"


_SEQ2SEQ = dict(
    word="shared.weight",
    eps=1e-5,  # nn.LayerNorm's default: their configs name no epsilon
    position="encoder.embed_positions.weight",  # stored by Marian / Pegasus; built when absent
    embed_scale="scale_embedding",
    query="encoder.layers.{l}.self_attn.q_proj",
    key="encoder.layers.{l}.self_attn.k_proj",
    capture=EAGER,
    capture_note="encoder stack",
)
# BART / mBART (learned, offset 2; encoder stack): words scaled when scale_embedding, layernorm_embedding.
_BART = dict(**_SEQ2SEQ, position_offset=2, embedding_norm="encoder.layernorm_embedding")
# OPT / BioGPT decoders: embed_tokens, a learned table offset by 2, layers.{l}.self_attn, nn.LayerNorm's epsilon.
_OPT = dict(
    causal=True,
    word="embed_tokens.weight",
    position="embed_positions.weight",
    position_offset=2,
    eps=1e-5,
    query="layers.{l}.self_attn.q_proj",
    key="layers.{l}.self_attn.k_proj",
    pre_norm="layers.{l}.self_attn_layer_norm",
)
# GPT-J / CodeGen: wte, h.{l}.ln_1, their rotary module's (sin, cos) per pair of interleaved dims.
_GPTJ = dict(kind=ROTARY, causal=True, word="wte.weight", pre_norm="h.{l}.ln_1", rotary_layout=SIN_COS_PAIRS)


def _sinusoidal(module: str, prefix: str) -> dict[str, str]:
    return {"positions_class": f"transformers.models.{module}.modeling_{module}:{prefix}SinusoidalPositionalEmbedding"}


def _musicgen(module: str, prefix: str) -> dict:
    """MusicGen's decoder (its causal LM; nested as `decoder` in the full model's config): one word table per codebook,
    their embeddings summed (not scaled: scale_embedding is unused), a [cos | sin] table from position 0, pre-LN."""
    return dict(
        causal=True,
        word="decoder.embed_tokens.0.weight",
        eps=1e-5,
        query="decoder.layers.{l}.self_attn.q_proj",
        key="decoder.layers.{l}.self_attn.k_proj",
        pre_norm="decoder.layers.{l}.self_attn_layer_norm",
        sizes={
            "hidden": ("decoder.hidden_size",),
            "layers": ("decoder.num_hidden_layers",),
            "heads": ("decoder.num_attention_heads",),
            "positions": ("decoder.max_position_embeddings",),
            "vocab": ("decoder.vocab_size",),
        },
        text_stack="decoder",
        tensors={
            "codebook_words": "decoder.embed_tokens.{c}.weight",
            "codebooks": "num_codebooks,decoder.num_codebooks",
            "positions_table": f"transformers.models.{module}.modeling_{module}:{prefix}SinusoidalPositionalEmbedding"
            ".get_embedding",
        },
        capture=REFUSED,
        capture_note="its input is one token per codebook at every position (audio codes), not one token sequence",
        description="sinusoidal absolute positions (not learned), added to the sum of one embedding per codebook (the "
        "content-free input: the average embedding of every codebook, summed); conditioning by cross-attention or a "
        "prefix has no positional score",
    )


def _rotary(module: str, prefix: str) -> str:
    return f"transformers.models.{module}.modeling_{module}:{prefix}RotaryEmbedding"


_LIKE: dict[str, tuple[str, dict]] = {}  # wrapper -> (the entry its language model is read as, fields changed)


def _wrapper(
    name: str,
    text: str,
    module: str = "language_model",
    config_key: str = "text_config",
    like: str = "",
    alone: str = "",
    **changes,
) -> Family:
    """A multimodal wrapper read as its language model of type `text` (config[`config_key`], tensors under a module
    named `module`): a placeholder that `_read_as_language_model` turns into `text`'s entry under this name. A
    language model whose type transformers builds only inside the wrapper (no model class of its own, so no parity
    case of its own) is read as the entry `like` with `changes`, and its type is listed with the wrapper's. `alone`:
    why texts run the language model alone (`Family.language_model_alone`)."""
    towers = changes.pop("towers", ())
    if like:
        _LIKE[name] = (like, changes)
    return Family(name, (name, text) if like else (name,), OTHER, language_model=(config_key, module, text),
                  language_model_alone=alone, towers=towers)  # fmt: skip


def _read_as_language_model(family: Family, families: tuple[Family, ...]) -> Family:
    """A wrapper's entry: its language model's entry, named as the wrapper and saying what it reads."""
    if family.language_model is None:
        return family
    text = family.language_model[2]
    like, changes = _LIKE.get(family.name, (text, {}))
    inner = replace(next(f for f in families if like in f.model_types and f.language_model is None), **changes)
    note = f"a multimodal checkpoint read as its language model, `{text}` ({family.language_model[0]})"
    if family.language_model_alone:
        note += f"; texts run that language model alone ({family.language_model_alone})"
    return replace(inner, name=family.name, model_types=family.model_types, language_model=family.language_model,
                   language_model_alone=family.language_model_alone, towers=family.towers,
                   description=f"{inner.mechanism}; {note}")  # fmt: skip


# Inkling 2 (families.relative_logits.clipped_scores); names: as transformers loads them | as the files hold them
_INKLING2 = dict(
    causal=True,
    word="(embed_tokens|embed).weight",
    embedding_norm="(embed_tokens.embed_norm|embed_norm)",
    query="layers.{l}.(self_attn.q_proj.linear|attn.wq_du)",
    key="layers.{l}.(self_attn.k_proj.linear|attn.wk_dv)",
    value="layers.{l}.(self_attn.v_proj.linear|attn.wv_dv)",
    # sliding layers: one norm; full layers: one each for q, k and v
    pre_norm="layers.{l}.(input_layernorm|q_input_layernorm|attn_norm|q_input_norm)",
    norm=RMSNORM,
    windows="layer_types",  # 'hybrid_sliding' layers
    sinks="layers.{l}.(self_attn.sink_proj|attn.attn_sink_proj).weight",  # input-conditioned: s_h = (y W_S)_h
    tensors={
        "qk_clip": "qk_l2_clip_threshold",  # config keys of the L2 clips
        "relative_clip": "rel_l2_clip_threshold",
        "query_scale": "layers.{l}.(self_attn.q_proj.norm|attn.q_l2_clip).scale",
        "key_norm": "layers.{l}.(k_input_layernorm|k_input_norm)",
        "key_convolution": "layers.{l}.(self_attn.k_proj.sconv.conv1d.weight|attn.k_sconv.weight)",  # sliding
        "key_static_taps": "layers.{l}.(self_attn.k_proj.sconv.static_weight|attn.k_sconv.static_w)",  # full
        "key_dynamic_taps": "layers.{l}.(self_attn.k_proj.sconv.weight_proj.weight|attn.k_sconv.weight_proj)",
        "relative_states": "layers.{l}.(self_attn.relative_position_bias.linear|attn.wr_du).weight",
        "relative_scale": "layers.{l}.(self_attn.relative_position_bias.norm|attn.rel_l2_clip).scale",
        "relative_profiles": "layers.{l}.(self_attn.relative_position_bias|attn.rel_logits_proj).proj",
        "sink_projection": "layers.{l}.(self_attn.sink_proj|attn.attn_sink_proj).weight",
        "depth_mix": "n_layers_per_attn_res_block",  # config key: layers after the first attend over blocks
        "depth_attention": "attention_input,mlp_input,final_input,message_input",  # its modules: softmaxes over depth
    },
    capture=EAGER,
    description="relative logits conditioned on the hidden state (families.relative_logits) with L2-clipped q/k, keys "
    "through a short causal convolution (input-conditioned taps in full layers), input-conditioned sinks, layer "
    "inputs mixed over earlier blocks; no rotary; sliding-window and log-scaled full layers",
)

FAMILIES: tuple[Family, ...] = (
    # -- learned absolute tables (SPEC §1-3)
    Family("bert", ("bert",), LEARNED, retrofit=True, **_BERT),
    Family("ernie", ("ernie",), LEARNED, **_BERT),
    Family("roberta", ("roberta", "xlm-roberta"), LEARNED, reserved_rows=True, retrofit=True, **_BERT),
    Family("camembert", ("camembert", "data2vec-text"), LEARNED, reserved_rows=True, **_BERT),
    Family(
        "tapas",
        ("tapas",),
        LEARNED,
        # token types default to zeros (text without a table: one cell, so positions are not reset): every token
        # adds row 0 of its seven token-type tables (segment, column, row, ranks, numeric relations)
        constant_rows=tuple(f"embeddings.token_type_embeddings_{i}.weight" for i in range(7)),
        description="learned absolute table (text alone: its table token types at 0, positions not reset per cell)",
        capture=EAGER,
        **{**_BERT, "token_type": None},
    ),
    Family(
        "git",
        ("git",),
        LEARNED,
        causal=True,
        description="learned absolute table (text alone: no image tokens before the text)",
        capture=EAGER,
        **{**_BERT, "token_type": None},
    ),
    Family(
        "luke",
        ("luke",),
        LEARNED,
        reserved_rows=True,
        description="learned absolute table; on text alone its words use BERT's query (the entity-aware ones need "
        "entity inputs)",
        capture=EAGER,
        **_BERT,
    ),
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
        value="encoder.albert_layer_groups.0.albert_layers.0.attention.value",
        shared_layers=True,
        layer_groups=(
            "encoder.albert_layer_groups.{g}.albert_layers.{j}.attention",
            "num_hidden_groups",
            "inner_group_num",
        ),
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
        capture=EAGER,
    ),
    Family(
        "rembert",
        ("rembert",),
        LEARNED,
        projection="encoder.embedding_hidden_mapping_in",  # input_embedding_size -> hidden, after the norm
        position_width=("input_embedding_size",),
        capture=EAGER,
        **_BERT,
    ),
    Family(
        "xmod",
        ("xmod",),
        LEARNED,
        reserved_rows=True,
        pre_norm="encoder.layer.{l}.attention.output.LayerNorm",  # applied before attention when config.pre_norm
        switches={"pre_norm": "pre_norm"},
        **_BERT,
    ),
    Family(
        "layoutlm",
        ("layoutlm",),
        LEARNED,
        # bbox defaults to zeros: every token adds row 0 of x (left, right), y (upper, lower), h and w
        constant_rows=tuple(f"embeddings.{t}_position_embeddings.weight" for t in ("x", "y", "x", "y", "h", "w")),
        description="learned absolute table (the 1-D one; its 2-D box tables enter at box 0)",
        capture=EAGER,
        **_BERT,
    ),
    Family(
        "big_bird",
        ("big_bird",),
        LEARNED,
        embed_scale="rescale_embeddings",
        windows="block_sparse",
        capture=EAGER,
        capture_note="up to (5 + 2 random blocks) x block size tokens, where it attends fully",
        **_BERT,
    ),
    Family(
        "longformer",
        ("longformer",),
        LEARNED,
        reserved_rows=True,
        windows="attention_window",
        capture=REFUSED,
        capture_note="sliding-chunk attention",
        **_BERT,
    ),
    Family(  # issue 34 (reformer)
        "reformer",
        ("reformer",),
        LEARNED,
        causal=True,  # config.is_decoder decides (`tensors['causal_when']`): its LM head is causal, its masked LM not
        word="embeddings.word_embeddings.weight",
        position="embeddings.position_embeddings.embedding.weight",  # axial_pos_embds off: one learned table
        query="encoder.layers.{l}.attention.self_attention.query",  # 'local' layers ('lsh' ones: query_key, unread)
        key="encoder.layers.{l}.attention.self_attention.key",
        pre_norm="encoder.layers.{l}.attention.layer_norm",  # reversible layers: layer 0's input is the embeddings
        sizes={"head_dim": ("attention_head_size",), "layers": ("attn_layers",)},  # one layer per attn_layers entry
        windows="neighbour_chunks",
        hybrid="LSH attention (each head attends the pairs that hashing its content with random rotations picks)",
        tensors={
            "axial_factors": "embeddings.position_embeddings.weights.{a}",  # axial_pos_embds: factor tables
            "axial_switch": "axial_pos_embds",
            "axial_parameters": "axial_pos_shape,axial_pos_embds_dim",  # rows and widths of its factor tables
            "layer_types": "attn_layers",
            "unscored_softmax_layers": "lsh",
            "causal_when": "is_decoder",
        },
        reads_padding=True,  # padding changes its chunks and buckets: texts run alone (their hidden states)
        capture=EAGER,
        capture_note="local layers: their per-chunk attention rebuilt as (queries x keys) matrices (texts alone); LSH "
        "layers listed, no positional score (pairs hashed per head, a key counted per sorted-chunk slot that pairs "
        "it: no one set of pairs per layer)",
        description="learned absolute table, axial (factor tables concatenated per position) or plain; causal where "
        "is_decoder",
    ),
    Family(
        "esm",
        ("esm",),
        LEARNED,
        switch_kinds=(ROTARY,),  # position_embedding_type 'rotary'
        word=_BERT["word"],
        position=_BERT["position"],
        reserved_rows=True,  # positions numbered from padding_idx + 1, as RoBERTa
        embedding_norm="embeddings.layer_norm",
        switches={"embedding_norm": "emb_layer_norm_before"},
        embed_scale="token_dropout",
        query=_BERT["query"],
        key=_BERT["key"],
        pre_norm="encoder.layer.{l}.attention.LayerNorm",
        rotary_class="transformers.models.esm.modeling_esm:EsmRotaryEmbedding",
        description="learned absolute table or rotary embeddings (position_embedding_type)",
    ),
    Family(
        "mobilebert",
        ("mobilebert",),
        LEARNED,
        word=_BERT["word"],
        position=_BERT["position"],
        token_type=_BERT["token_type"],
        embedding_norm=_BERT["embedding_norm"],
        word_projection="embeddings.embedding_transformation",
        switches={"trigram": "trigram_input"},
        position_width=("hidden_size",),
        query=_BERT["query"],
        key=_BERT["key"],
        bottleneck=(
            (("use_bottleneck", "use_bottleneck_attention"), "encoder.layer.{l}.bottleneck.input"),
            (("use_bottleneck", "key_query_shared_bottleneck"), "encoder.layer.{l}.bottleneck.attention"),
        ),
        norm=NONORM,  # normalization_type 'no_norm' (every released MobileBERT): posprobe reads no other
    ),
    Family(
        "squeezebert",
        ("squeezebert",),
        LEARNED,
        query="encoder.layers.{l}.attention.query",
        key="encoder.layers.{l}.attention.key",
        qkv=GROUPED_CONV,
        capture=EAGER,
        **{k: _BERT[k] for k in ("word", "position", "token_type", "embedding_norm")},
    ),
    Family(
        "gpt2",
        ("gpt2", "gpt-sw3"),  # GPT-SW3: GPT-2's config class and layout (transformers names it for its tokenizer)
        LEARNED,
        causal=True,
        word="wte.weight",
        position="wpe.weight",
        query="h.{l}.attn.c_attn",
        key="h.{l}.attn.c_attn",
        qkv=GPT2_CONV1D,
        pre_norm="h.{l}.ln_1",
    ),
    Family(
        "openai-gpt",
        ("openai-gpt",),
        LEARNED,
        causal=True,
        word="tokens_embed.weight",
        position="positions_embed.weight",
        query="h.{l}.attn.c_attn",
        key="h.{l}.attn.c_attn",
        qkv=GPT2_CONV1D,
        capture=EAGER,
    ),  # post-LN: the attention reads the summed embeddings, and each later layer the previous layer's output
    Family(
        "gpt_bigcode",
        ("gpt_bigcode",),
        LEARNED,
        causal=True,
        word="wte.weight",
        position="wpe.weight",
        query="h.{l}.attn.c_attn",  # one Linear: multi_query [q; k; v] with one key head, else rows per head
        key="h.{l}.attn.c_attn",
        qkv=STACKED,
        pre_norm="h.{l}.ln_1",
        scaling="head_dim_if:scale_attn_weights",
    ),
    Family(
        "gpt_neo",
        ("gpt_neo",),
        LEARNED,
        causal=True,
        word="wte.weight",
        position="wpe.weight",
        query="h.{l}.attn.attention.q_proj",
        key="h.{l}.attn.attention.k_proj",
        pre_norm="h.{l}.ln_1",
        scaling="none",  # GPT-Neo does not divide q.k by sqrt(d_h)
        windows="attention_layers",
        capture=EAGER,
    ),
    Family(
        "opt", ("opt",), LEARNED, word_projection="project_in", switches={"pre_norm": "do_layer_norm_before"}, **_OPT
    ),  # fmt: skip
    Family("biogpt", ("biogpt",), LEARNED, embed_scale="scale_embedding", **{**_OPT, "eps": 1e-5, "capture": EAGER}),
    Family("bart", ("bart",), LEARNED, **_BART),  # post-LN: no norm before attention
    Family("mbart", ("mbart",), LEARNED, pre_norm="encoder.layers.{l}.self_attn_layer_norm", **_BART),
    Family("plbart", ("plbart",), LEARNED, **_BART),  # BART's layout
    Family("mvp", ("mvp",), LEARNED, **_BART),  # BART's layout (prompt layers, when on, feed cross-attention only)
    Family(
        "blenderbot", ("blenderbot",), LEARNED, pre_norm="encoder.layers.{l}.self_attn_layer_norm", **_SEQ2SEQ
    ),  # fmt: skip
    Family(
        "blenderbot-small", ("blenderbot-small",), LEARNED, embedding_norm="encoder.layernorm_embedding", **_SEQ2SEQ
    ),  # fmt: skip
    # issue 34 (s2s): encoder-decoders whose language model is the decoder, and audio decoders
    Family(
        "whisper",
        ("whisper",),
        LEARNED,
        causal=True,
        word="decoder.embed_tokens.weight",
        position="decoder.embed_positions.weight",  # no offset; words are not scaled (scale_embedding: encoder only)
        eps=1e-5,
        query="decoder.layers.{l}.self_attn.q_proj",
        key="decoder.layers.{l}.self_attn.k_proj",  # no key bias
        pre_norm="decoder.layers.{l}.self_attn_layer_norm",
        sizes={
            "layers": ("decoder_layers",),
            "heads": ("decoder_attention_heads",),
            "positions": ("max_target_positions",),
        },
        text_stack="decoder",
        capture=EAGER,
        capture_note="decoder stack, run without encoder states: no cross-attention",
        description="learned absolute table (the decoder, as WhisperForCausalLM; its encoder reads audio features, "
        "not text, and is not read; cross-attention pairs a query with audio frames: no positional score)",
    ),
    Family(
        "trocr",
        ("trocr",),
        LEARNED,
        switch_kinds=(SINUSOIDAL,),  # use_learned_position_embeddings off
        causal=True,
        word="decoder.embed_tokens.weight",
        position="decoder.embed_positions.weight",
        position_offset=2,
        embedding_norm="decoder.layernorm_embedding",
        switches={"embedding_norm": "layernorm_embedding"},
        embed_scale="scale_embedding",
        eps=1e-5,
        query="decoder.layers.{l}.self_attn.q_proj",  # post-LN: no norm before attention
        key="decoder.layers.{l}.self_attn.k_proj",
        sizes={"layers": ("decoder_layers",), "heads": ("decoder_attention_heads",)},
        tensors=_sinusoidal("trocr", "TrOCR"),  # numbered from padding_idx + 1, as M2M100
        capture=EAGER,
        capture_note="run without image features: no cross-attention",
        description="learned absolute table, or sinusoidal positions (use_learned_position_embeddings); a decoder "
        "(TrOCRForCausalLM) whose cross-attention to image features has no positional score",
    ),
    Family(
        "bigbird_pegasus",
        ("bigbird_pegasus",),
        LEARNED,
        word="shared.weight",
        position="encoder.embed_positions.weight",  # no offset; layernorm_embedding is the encoder's final norm
        embed_scale="scale_embedding",
        eps=1e-5,
        query="encoder.layers.{l}.self_attn.self.query",  # BigBird's attention (full or block-sparse) in self_attn
        key="encoder.layers.{l}.self_attn.self.key",
        pre_norm="encoder.layers.{l}.self_attn_layer_norm",
        windows="block_sparse",
        encoder_decoder=True,
        decoder_stack=dict(  # full causal self-attention over a learned table of its own (BART's attention)
            position="decoder.embed_positions.weight",
            query="decoder.layers.{l}.self_attn.q_proj",
            key="decoder.layers.{l}.self_attn.k_proj",
            pre_norm="decoder.layers.{l}.self_attn_layer_norm",
            windows=None,
            sizes={"layers": ("decoder_layers",), "heads": ("decoder_attention_heads",)},
        ),
        capture=EAGER,
        capture_note="encoder stack, up to (5 + 2 random blocks) x block size tokens, where it attends fully",
        description="learned absolute tables (encoder: block-sparse beyond (5 + 2 random blocks) x block size; "
        "decoder, --stack decoder: full causal self-attention over its own table; cross-attention has no "
        "positional score)",
    ),
    Family(
        "prophetnet",
        ("prophetnet",),
        LEARNED,
        word="(encoder.word_embeddings|word_embeddings).weight",  # one table, tied: saved once, at the top
        position="encoder.position_embeddings.weight",
        reserved_rows=True,  # positions numbered from padding_idx + 1, as RoBERTa
        embedding_norm="encoder.embeddings_layer_norm",
        eps=1e-5,
        query="encoder.layers.{l}.self_attn.query_proj",  # post-LN
        key="encoder.layers.{l}.self_attn.key_proj",
        sizes={"layers": ("num_encoder_layers",), "heads": ("num_encoder_attention_heads",)},
        encoder_decoder=True,
        decoder_stack=dict(  # its main stream: causal, a table of its own plus a bias per bucket from each query
            kind=BUCKET_BIAS,
            position="decoder.position_embeddings.weight",
            embedding_norm="decoder.embeddings_layer_norm",
            query="decoder.layers.{l}.self_attn.query_proj",  # post-LN
            key="decoder.layers.{l}.self_attn.key_proj",
            sizes={"layers": ("num_decoder_layers",), "heads": ("num_decoder_attention_heads",)},
            tensors={
                "relative_bias_projection": "decoder.layers.{l}.self_attn.relative_pos_embeddings",  # (B H, d)
                "num_buckets": "num_buckets",
                "max_distance": "relative_max_distance",
            },
        ),
        capture=EAGER,
        capture_note="encoder stack",
        description="learned absolute table (encoder stack); --stack decoder: the decoder's main stream, causal, "
        "its own learned table plus a relative bucket bias that each query's input gives (a Linear per layer); its "
        "ngram predict streams are not read (their inputs are ngram embeddings, not the text's tokens, and each "
        "attends the main stream's keys beside its own position)",
    ),
    Family("musicgen", ("musicgen", "musicgen_decoder"), SINUSOIDAL, **_musicgen("musicgen", "Musicgen")),
    Family(
        "musicgen_melody",
        ("musicgen_melody", "musicgen_melody_decoder"),
        SINUSOIDAL,
        **_musicgen("musicgen_melody", "MusicgenMelody"),
    ),
    Family(
        "moshi",
        ("moshi",),
        rotary_class=_rotary("moshi", "Moshi"),
        tensors={"more_words": "1"},  # its word table holds vocab_size + 1 rows
        description="rotary embeddings (RoPE) in the temporal transformer, read on text tokens alone (as "
        "MoshiForCausalLM runs it; the full model, given audio, adds codebook embeddings at each position); the depth "
        "decoder over codebooks has no positional encoding and is not read",
        # the full model also holds a depth decoder (depth_decoder.layers.{l}): its temporal layers are model.layers
        **{
            **_LLAMA,
            "query": "(model.layers|layers).{l}.self_attn.q_proj.linear",
            "key": "(model.layers|layers).{l}.self_attn.k_proj.linear",
            "pre_norm": "(model.layers|layers).{l}.input_layernorm",
        },
    ),
    # -- rotary (SPEC §9)
    Family("llama", ("llama",), rotary_class=_rotary("llama", "Llama"), **_LLAMA),
    Family("mistral", ("mistral",), rotary_class=_rotary("mistral", "Mistral"), windows="sliding_window", **_LLAMA),
    Family("mixtral", ("mixtral",), rotary_class=_rotary("mixtral", "Mixtral"), windows="sliding_window", **_LLAMA),
    Family("qwen2", ("qwen2",), rotary_class=_rotary("qwen2", "Qwen2"), windows="layer_types", **_LLAMA),
    Family(
        "qwen3", ("qwen3",), rotary_class=_rotary("qwen3", "Qwen3"), qk_norm=_QK_NORM, windows="layer_types", **_LLAMA
    ),  # fmt: skip
    Family(
        "qwen3_moe",
        ("qwen3_moe",),
        rotary_class=_rotary("qwen3_moe", "Qwen3Moe"),
        qk_norm=_QK_NORM,
        windows="sliding_window",
        **_LLAMA,
    ),  # fmt: skip
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
        scaling="rsqrt:query_pre_attn_scalar",
        softcap="attn_logit_softcapping",
        windows="layer_types",
        **{**_LLAMA, "norm": RMSNORM_PLUS1},
    ),
    Family(
        "gemma3_text",
        ("gemma3_text",),
        rotary_class=_rotary("gemma3", "Gemma3"),  # one rotary setting per layer type (local / global)
        embed_scale="sqrt_hidden",
        scaling="rsqrt:query_pre_attn_scalar",
        softcap="attn_logit_softcapping",
        qk_norm=_QK_NORM,
        windows="layer_types",
        bidirectional="use_bidirectional_attention",
        **{**_LLAMA, "norm": RMSNORM_PLUS1},
    ),
    # multimodal models (issue 34): wrappers, each read as its language model (`_wrapper`); Phi-4-multimodal
    _wrapper("gemma3", "gemma3_text"),
    _wrapper("qwen3_5", "qwen3_5_text"),  # M-RoPE: a text token's position is the same on every axis
    _wrapper("qwen3_5_moe", "qwen3_5_moe_text"),
    _wrapper("qwen4_exp", "qwen4_exp_text"),  # issue 34 (qwen4); M-RoPE as Qwen3.5's
    _wrapper("got_ocr2", "qwen2"),
    _wrapper("fuyu", "persimmon"),  # image patches enter as embeddings through a Linear: no vision attention
    _wrapper("modernvbert", "modernbert", module="text_model"),
    _wrapper("ultravbert", "ultrabert", module="text_model"),
    _wrapper("moss_transcribe_diarize", "qwen3"),  # a Whisper-style audio encoder beside it
    _wrapper("gemma4", "gemma4_text"),  # vision and audio towers beside it
    _wrapper("gemma4_unified", "gemma4_unified_text"),
    # issue 34 (wrap): wrappers that transformers cannot build or run on text: texts run their language model alone
    _wrapper("gemma3n", "gemma3n_text", alone="its vision tower is a timm model, built only with timm installed"),
    _wrapper("llama4", "llama4_text", alone="its forward fails on text once its language model has run"),
    # Gemma 4's draft models (assisted decoding; a config is valid with text_config hidden_size_per_layer_input 0,
    # vocab_size_per_layer_input 0, enable_moe_block and use_double_wide_mlp False, every layer KV-shared)
    *(
        Family(name, (name,), OTHER, causal=True, draft_of=backbone, description=_DRAFT.format(backbone))
        for name, backbone in (("gemma4_assistant", "gemma4_text"), ("gemma4_unified_assistant", "gemma4_unified_text"))
    ),
    _wrapper("emu3", "emu3_text_model", module="text_model", like="llama", rotary_class=_rotary("emu3", "Emu3")),
    Family(  # Phi-3's layout; its vision and audio LoRA adapters are PEFT adapters loaded apart: on text, with
        "phi4_multimodal",  # none active, the base weights compute (its image and audio encoders sit in
        ("phi4_multimodal",),  # embed_tokens_extend, beside the word table)
        rotary_class=_rotary("phi4_multimodal", "Phi4Multimodal"),
        windows="sliding_window",
        **{**_LLAMA, "query": "layers.{l}.self_attn.qkv_proj", "key": "layers.{l}.self_attn.qkv_proj", "qkv": STACKED},
    ),
    _wrapper(
        "mllama",
        "mllama_text_model",
        like="llama",
        rotary_class=_rotary("mllama", "Mllama"),
        hybrid="cross-attention layers to the image (skipped on text alone)",
        hybrid_layers="cross_attention_layers",
        tensors={"more_words": "8"},  # its word table holds 8 rows beyond vocab_size
        capture_note=HYBRID_CAPTURE + "; hidden states refused (no layer input for the skipped layers)",
    ),
    Family(
        "gemma3n_text",
        ("gemma3n_text",),
        rotary_class=_rotary("gemma3n", "Gemma3n"),  # one rotary setting per layer type (local / global)
        embed_scale="sqrt_hidden",
        scaling="none",  # q.k is not scaled (its q/k norms set the size)
        qk_norm=_QK_NORM,
        windows="layer_types",
        tensors={
            "altup": "layers.{l}.altup",
            "altup_projections": "altup_projections.{i}",
            "kv_sharing": "kv_sharing_modes",
        },
        description="rotary embeddings (RoPE), a setting per layer type; attention reads AltUp's prediction of the "
        "active stream; the last num_kv_shared_layers layers attend to an earlier layer's keys",
        **_LLAMA,  # Gemma 3n's norms multiply by w (not 1 + w)
    ),
    Family(
        "gemma4_text",
        ("gemma4_text",),
        rotary_class=_rotary("gemma4", "Gemma4Text"),  # per layer type; global layers' proportional (partial) rope
        description=_GEMMA4,
        **_GEMMA4_ENTRY,
    ),
    Family(
        "gemma4_unified_text",
        ("gemma4_unified_text",),
        rotary_class=_rotary("gemma4_unified", "Gemma4UnifiedText"),
        description=_GEMMA4,
        **_GEMMA4_ENTRY,
    ),
    Family(
        "phi",
        ("phi",),
        rotary_class=_rotary("phi", "Phi"),
        qk_norm=_QK_LAYERNORM,  # when qk_layernorm
        switches={"qk_norm": "qk_layernorm"},
        **{**_LLAMA, "norm": LAYERNORM},
    ),
    Family(
        "phi3",
        ("phi3",),
        rotary_class=_rotary("phi3", "Phi3"),
        windows="sliding_window",
        **{**_LLAMA, "query": "layers.{l}.self_attn.qkv_proj", "key": "layers.{l}.self_attn.qkv_proj", "qkv": STACKED},
    ),
    Family(
        "starcoder2",
        ("starcoder2",),
        rotary_class=_rotary("starcoder2", "Starcoder2"),
        windows="sliding_window",
        **{**_LLAMA, "norm": LAYERNORM},
    ),  # fmt: skip
    Family(
        "stablelm",
        ("stablelm",),
        rotary_class=_rotary("stablelm", "StableLm"),  # partial rotary
        qk_norm=tuple(p + ".norms.{h}" for p in _QK_LAYERNORM),  # one LayerNorm per head, when qk_layernorm
        switches={"qk_norm": "qk_layernorm"},
        **{**_LLAMA, "norm": LAYERNORM, "capture": EAGER},
    ),
    Family(
        "olmo",
        ("olmo",),
        rotary_class=_rotary("olmo", "Olmo"),
        clip="clip_qkv",
        eps=1e-5,
        **{**_LLAMA, "norm": PLAIN_LAYERNORM},
    ),  # fmt: skip
    Family(
        "olmo2",
        ("olmo2",),
        rotary_class=_rotary("olmo2", "Olmo2"),
        qk_norm=_QK_NORM,
        qk_norm_scope="all",  # RMS norm of the whole q / k projection, before the head split
        **{**_LLAMA, "pre_norm": None},  # post-norm: the attention reads the layer input itself
    ),
    Family(
        "granite",
        ("granite",),
        rotary_class=_rotary("granite", "Granite"),
        scaling="value:attention_multiplier",
        embed_scale="embedding_multiplier",
        **_LLAMA,
    ),
    Family(
        "cohere",
        ("cohere",),
        rotary_class=_rotary("cohere", "Cohere"),
        rotary_layout=INTERLEAVED,
        qk_norm=_QK_NORM,  # when use_qk_norm: one weight per head
        **{**_LLAMA, "norm": LAYERNORM},  # LayerNorm without bias
    ),
    # -- further encoders and decoders of covered layouts (issue 34)
    Family("bert-generation", ("bert-generation",), LEARNED, **{k: v for k, v in _BERT.items() if k != "token_type"}),
    Family("ibert", ("ibert",), LEARNED, reserved_rows=True, capture=EAGER, **_BERT),
    Family("splinter", ("splinter",), LEARNED, capture=EAGER, **_BERT),
    Family(
        "roberta-prelayernorm",
        ("roberta-prelayernorm",),
        LEARNED,
        reserved_rows=True,
        pre_norm="encoder.layer.{l}.attention.LayerNorm",
        **_BERT,
    ),
    Family(
        "xlm-roberta-xl",
        ("xlm-roberta-xl",),
        LEARNED,
        reserved_rows=True,
        pre_norm="encoder.layer.{l}.attention.self_attn_layer_norm",
        **{k: v for k, v in _BERT.items() if k != "embedding_norm"},
    ),
    Family("eurobert", ("eurobert",), rotary_class=_rotary("eurobert", "EuroBert"), **{**_LLAMA, "causal": False}),
    Family(
        "modernbert-decoder",
        ("modernbert-decoder",),
        ROTARY,
        causal=True,
        word="embeddings.tok_embeddings.weight",
        embedding_norm="embeddings.norm",
        query="layers.{l}.attn.q_proj",
        key="layers.{l}.attn.k_proj",
        pre_norm="layers.{l}.attn_norm",
        pre_norm_from=1,  # layer 0 reads the embedding norm's output directly
        rotary_class=_rotary("modernbert_decoder", "ModernBertDecoder"),
        windows="layer_types",
    ),
    # -- MoE and other cousins of covered rotary families (issue 34): Llama's layout, their own rotary modules
    *(
        Family(t, (t,), rotary_class=rotary, windows=windows, **{**_LLAMA, **extra})
        for t, rotary, windows, extra in (
            ("qwen2_moe", _rotary("qwen2_moe", "Qwen2Moe"), "layer_types", {}),
            ("phimoe", _rotary("phimoe", "Phimoe"), "sliding_window", {"norm": LAYERNORM}),
            ("olmoe", _rotary("olmoe", "Olmoe"), None, {"qk_norm": _QK_NORM, "qk_norm_scope": "all"}),
            ("granitemoe", _rotary("granitemoe", "GraniteMoe"), None, _GRANITE),
            ("granitemoeshared", _rotary("granitemoeshared", "GraniteMoeShared"), None, _GRANITE),
            (
                "glm4_moe",
                _rotary("glm4_moe", "Glm4Moe"),
                None,
                {"qk_norm": _QK_NORM, "switches": {"qk_norm": "use_qk_norm"}},
            ),
            ("minimax_m2", _rotary("minimax_m2", "MiniMaxM2"), None, {"qk_norm": _QK_NORM, "qk_norm_scope": "all"}),
            ("ernie4_5", _rotary("ernie4_5", "Ernie4_5"), None, {"rotary_layout": HALF_INTERLEAVED}),
            ("ernie4_5_moe", _rotary("ernie4_5_moe", "Ernie4_5_Moe"), None, {"rotary_layout": HALF_INTERLEAVED}),
            ("helium", _rotary("helium", "Helium"), None, {"rotary_layout": HALF_INTERLEAVED}),
            ("arcee", _rotary("arcee", "Arcee"), None, {}),
            ("seed_oss", _rotary("seed_oss", "SeedOss"), None, {}),
            ("internlm3", _rotary("llama", "Llama"), None, {}),
            ("ministral3", _rotary("ministral3", "Ministral3"), "sliding_window", {}),
            ("cwm", _rotary("cwm", "Cwm"), "layer_types", {}),
            ("bitnet", _rotary("bitnet", "BitNet"), None, {}),
            (
                "apertus",
                _rotary("apertus", "Apertus"),
                None,
                {"qk_norm": _QK_NORM, "pre_norm": "layers.{l}.attention_layernorm"},
            ),
            ("ministral", _rotary("ministral", "Ministral"), "layer_types", {}),
            ("glm4", _rotary("glm4", "Glm4"), None, {"rotary_layout": HALF_INTERLEAVED}),
            ("solar_open", _rotary("solar_open", "SolarOpen"), None, {}),
            (
                "flex_olmo",
                _rotary("flex_olmo", "FlexOlmo"),
                None,
                {"qk_norm": _QK_NORM, "qk_norm_scope": "all", "pre_norm": None},
            ),
        )
    ),  # fmt: skip
    Family(
        "llama4_text",
        ("llama4_text",),
        rotary_class=_rotary("llama4", "Llama4Text"),
        rotary_layout=COMPLEX,
        windows="layer_types",  # chunked attention in the rotary layers
        nope="no_rope_layers",
        tensors={"post_rotary_l2_norm": "use_qk_norm", "temperature_tuning": "attn_temperature_tuning"},
        description="rotary embeddings (RoPE) in chunked-attention layers; global NoPE layers with attention "
        "temperature tuning",
        **_LLAMA,
    ),
    # -- per-layer local / global attention (issue 34)
    Family(
        "olmo3",
        ("olmo3",),
        rotary_class=_rotary("olmo3", "Olmo3"),  # one rotary setting per layer type
        qk_norm=_QK_NORM,
        qk_norm_scope="all",
        windows="layer_types",
        **{**_LLAMA, "pre_norm": None},  # post-norm, as OLMo-2
    ),
    Family(
        "exaone4",
        ("exaone4",),
        rotary_class=_rotary("exaone4", "Exaone4"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="global_layers_if_windowed",
        description="rotary embeddings (RoPE) in sliding-window layers; global layers NoPE (with a window)",
        **{**_LLAMA, "pre_norm": None},  # post-norm: the attention reads the layer input itself
    ),
    # -- dense and MoE variants of covered designs, second round (issue 34; tests/test_family_gaps.py lists the rest)
    Family(
        "vaultgemma",
        ("vaultgemma",),
        rotary_class=_rotary("vaultgemma", "VaultGemma"),
        embed_scale="sqrt_hidden",
        scaling="rsqrt:query_pre_attn_scalar",
        softcap="attn_logit_softcapping",
        windows="layer_types",
        **{**_LLAMA, "norm": RMSNORM_PLUS1},
    ),
    Family(
        "dots1",
        ("dots1",),
        rotary_class=_rotary("dots1", "Dots1"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        **_LLAMA,
    ),
    Family(
        "hyperclovax", ("hyperclovax",), rotary_class=_rotary("hyperclovax", "HyperCLOVAX"), **{**_LLAMA, **_GRANITE}
    ),  # fmt: skip
    Family("jais2", ("jais2",), rotary_class=_rotary("jais2", "Jais2"), **{**_LLAMA, "norm": LAYERNORM}),
    Family("iquestcoder", ("iquestcoder",), rotary_class=_rotary("llama", "Llama"), **_LLAMA),  # Llama's model
    Family(
        "exaone",
        ("exaone",),
        rotary_class=_rotary("llama", "Llama"),  # transformers runs EXAONE 3 as Llama, renaming its tensors
        **{
            **_LLAMA,
            "word": "(embed_tokens|wte).weight",  # files: transformer.wte, transformer.h.{l}; loaded: Llama's names
            "query": "{l}.(self_attn|attn.attention).q_proj",
            "key": "{l}.(self_attn|attn.attention).k_proj",
            "pre_norm": "{l}.(input_layernorm|ln_1)",
        },
    ),
    Family(
        "nemotron",
        ("nemotron",),
        rotary_class=_rotary("nemotron", "Nemotron"),  # partial rotary
        **{**_LLAMA, "norm": LAYERNORM_PLUS1},
    ),
    Family("aria_text", ("aria_text",), rotary_class=_rotary("aria", "AriaText"), **_LLAMA),
    Family(
        "apertus1p5_text",
        ("apertus1p5_text",),
        rotary_class=_rotary("apertus1p5", "Apertus1p5Text"),
        qk_norm=_QK_NORM,
        **{**_LLAMA, "pre_norm": "layers.{l}.attention_layernorm"},
    ),
    Family(
        "mellum",
        ("mellum",),
        rotary_class=_rotary("mellum", "Mellum"),  # one rotary setting per layer type
        qk_norm=_QK_NORM,
        windows="layer_types",
        **_LLAMA,
    ),
    Family(
        "flint",
        ("flint",),
        rotary_class=_rotary("flint", "Flint"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="global_layers",
        sinks="layers.{l}.self_attn.(sinks|softmax_offset)",  # files: softmax_offset; loaded: sinks
        description="rotary embeddings (RoPE) in sliding-window layers; global layers NoPE; learned per-head "
        "attention sinks",
        **_LLAMA,
    ),
    Family(
        "kolibri1",
        ("kolibri1",),
        rotary_class=_rotary("kolibri1", "Kolibri1"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="global_layers_if_windowed",
        description="rotary embeddings (RoPE) in sliding-window layers; global layers NoPE (with a window)",
        **_LLAMA,
    ),
    Family(
        "afmoe",
        ("afmoe",),
        rotary_class=_rotary("afmoe", "Afmoe"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="global_layers_by_type",
        embed_scale="mup_enabled",
        description="rotary embeddings (RoPE) in sliding-window layers; global layers NoPE",
        **_LLAMA,
    ),
    # issue 34 (heads)
    Family(
        "laguna",
        ("laguna",),
        rotary_class=_rotary("laguna", "Laguna"),  # per layer type: its own base and partial factor
        qk_norm=_QK_NORM,
        windows="layer_types",
        tensors={"query_heads_per_layer": "num_attention_heads_per_layer"},
        capture_note="a layer's missing query heads (num_attention_heads_per_layer) are NaN, no such head",
        description="rotary embeddings (RoPE) with a setting per layer type, in sliding-window and global layers; "
        "a query-head count per layer (F̂'s head axis holds the most heads; a layer's missing heads are NaN); "
        "a softplus output gate (after the softmax)",
        **_LLAMA,
    ),
    Family(
        "exaone_moe",
        ("exaone_moe",),
        rotary_class=_rotary("exaone_moe", "ExaoneMoe"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="global_layers_if_windowed",
        description="rotary embeddings (RoPE) in sliding-window layers; global layers NoPE (with a window)",
        **_LLAMA,
    ),
    Family("hy_v3", ("hy_v3",), rotary_class=_rotary("hy_v3", "HYV3"), qk_norm=_QK_NORM, **_LLAMA),
    Family(
        "esmc",
        ("esmc",),
        rotary_class=_rotary("esmc", "Esmc"),
        qk_norm=_QK_NORM,
        qk_norm_scope="all",  # LayerNorms (no bias) of the whole q / k projection, before the head split
        eps=1e-5,  # nn.LayerNorm's default: its config names no epsilon
        **{**_LLAMA, "causal": False, "norm": LAYERNORM},
    ),
    Family(
        "ultrabert",
        ("ultrabert",),
        rotary_class=_rotary("ultrabert", "Ultrabert"),  # one rotary setting per layer type
        windows="layer_types_inclusive",  # sliding layers attend |j - i| <= sliding_window
        **{**_LLAMA, "causal": False},
    ),
    *(
        Family(
            t,
            (t,),
            rotary_class=_rotary(t, prefix),
            qk_norm=_QK_AFTER_ROPE,  # RMS norms per head, of the rotated q and k
            qk_norm_after_rotary=True,
            description="rotary embeddings (RoPE), then RMS norms of the rotated q and k",
            **_LLAMA,
        )
        for t, prefix in (("hunyuan_v1_dense", "HunYuanDenseV1"), ("hunyuan_v1_moe", "HunYuanMoEV1"))
    ),
    Family(
        "dbrx",
        ("dbrx",),
        ROTARY,
        causal=True,
        word="wte.weight",
        query="blocks.{l}.norm_attn_norm.attn.Wqkv",  # one Linear: [q; k; v]
        key="blocks.{l}.norm_attn_norm.attn.Wqkv",
        qkv=STACKED,
        pre_norm="blocks.{l}.norm_attn_norm.norm_1",  # LayerNorm without bias
        eps=1e-5,  # nn.LayerNorm's default: its config names no epsilon
        clip="attn_config.clip_qkv",
        rotary_class=_rotary("dbrx", "Dbrx"),
    ),
    Family(
        "nanochat",
        ("nanochat",),
        rotary_class=_rotary("nanochat", "NanoChat"),
        rotary_layout=REVERSED,
        embedding_norm="norm",  # the same weightless norm before the layers and after them
        tensors={"post_rotary_l2_norm": "always"},  # weightless RMS norms of the rotated q and k
        description="rotary embeddings (RoPE), then weightless RMS norms of the rotated q and k",
        **{**_LLAMA, "norm": PLAIN_RMSNORM},
    ),
    # -- hybrids: softmax attention in some layers, recurrent / state-space / convolution layers in the others
    Family(
        "lfm2",
        ("lfm2",),
        rotary_class=_rotary("lfm2", "Lfm2"),
        qk_norm=_QK_LAYERNORM,  # RMS norms per head
        hybrid="gated short-convolution layers",
        capture=INTERFACE,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its attention layers; short convolutions between them",
        **{**_LLAMA, "pre_norm": "layers.{l}.operator_norm"},
    ),
    Family(
        "lfm2_moe",
        ("lfm2_moe",),
        rotary_class=_rotary("lfm2_moe", "Lfm2Moe"),
        qk_norm=_QK_LAYERNORM,  # RMS norms per head
        hybrid="gated short-convolution layers",
        capture=INTERFACE,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its attention layers; short convolutions between them",
        **{**_LLAMA, "pre_norm": "layers.{l}.operator_norm"},
    ),
    Family(
        "bamba",
        ("bamba",),
        rotary_class=_rotary("bamba", "Bamba"),
        hybrid="Mamba-2 state-space layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its attention layers; Mamba-2 layers between them",
        **_LLAMA,
    ),
    Family(
        "qwen3_next",
        ("qwen3_next",),
        rotary_class=_rotary("qwen3_next", "Qwen3Next"),  # partial rotary
        qk_norm=_QK_NORM,
        hybrid="gated DeltaNet linear-attention layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its gated attention layers; gated DeltaNet layers between them",
        **{**_LLAMA, "qkv": GATED_QUERY, "norm": RMSNORM_PLUS1},
    ),
    *(
        Family(
            t,
            (t,),
            rotary_class=_rotary(module, prefix),  # partial rotary; M-RoPE, one position for all its axes on text
            qk_norm=_QK_NORM,
            hybrid="gated DeltaNet linear-attention layers",
            capture=EAGER,
            capture_note=HYBRID_CAPTURE,
            description="rotary embeddings (RoPE) in its gated attention layers; gated DeltaNet layers between them",
            **{**_LLAMA, "qkv": GATED_QUERY, "norm": RMSNORM_PLUS1},
        )
        for t, module, prefix in (
            ("qwen3_5_text", "qwen3_5", "Qwen3_5Text"),
            ("qwen3_5_moe_text", "qwen3_5_moe", "Qwen3_5MoeText"),
        )
    ),
    # issue 34 (qwen4): Qwen3.5's gated attention behind a gated mix of hyper-connection streams, a block indexer
    Family(
        "qwen4_exp_text",
        ("qwen4_exp_text",),
        rotary_class=_rotary("qwen4_exp", "Qwen4ExpText"),  # partial rotary; M-RoPE, one position for all its axes
        qk_norm=_QK_NORM,
        indexer="layers.{l}.self_attn.indexer",
        hybrid="gated DeltaNet linear-attention layers (some with hashed n-gram embeddings: PLE)",
        tensors={
            "stream_mix": "layers.{l}.attn_hyper_connection",  # the layer's gated mix of its streams (no input norm)
            "indexer_blocks": "mean",  # blocks of keys mean-pooled, each rotated at its start (families.pooled_blocks)
        },
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its gated attention layers, each query attending the key blocks its "
        "indexer picks (top-k mean-pooled blocks plus its own partial block); hyper-connection streams; gated "
        "DeltaNet layers between them",
        **{**_LLAMA, "pre_norm": None, "qkv": GATED_QUERY, "norm": RMSNORM_PLUS1},
    ),
    Family(
        "granitemoehybrid",
        ("granitemoehybrid",),
        switch_kinds=(NOPE,),  # position_embedding_type other than 'rope': no positional term
        rotary_class=_rotary("granitemoehybrid", "GraniteMoeHybrid"),
        hybrid="Mamba-2 state-space layers",
        capture=INTERFACE,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) or none (position_embedding_type) in its attention layers; Mamba-2 "
        "layers between them",
        **{**_LLAMA, **_GRANITE},
    ),
    Family(
        "minimax",
        ("minimax",),
        rotary_class=_rotary("minimax", "MiniMax"),
        windows="sliding_window",
        hybrid="lightning (linear) attention layers",
        capture=INTERFACE,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its softmax attention layers; linear attention layers between them",
        **_LLAMA,
    ),
    Family(
        "olmo_hybrid",
        ("olmo_hybrid",),
        rotary_class=_rotary("olmo_hybrid", "OlmoHybrid"),
        qk_norm=_QK_NORM,
        qk_norm_scope="all",
        hybrid="gated DeltaNet linear-attention layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its attention layers; gated DeltaNet layers between them",
        **{**_LLAMA, "pre_norm": None},  # post-norm, as OLMo-2
    ),
    Family(
        "falcon_h1",
        ("falcon_h1",),
        rotary_class=_rotary("falcon_h1", "FalconH1"),
        embed_scale="embedding_multiplier",
        tensors={"attention_in_multiplier": "attention_in_multiplier", "key_multiplier": "key_multiplier"},
        capture=EAGER,
        description="rotary embeddings (RoPE) in attention run in parallel with a Mamba-2 branch in every layer",
        **_LLAMA,
    ),
    Family(
        "jamba",
        ("jamba",),
        NOPE,
        hybrid="Mamba state-space layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="no positional encoding in its attention layers (NoPE); Mamba layers carry position",
        **{k: v for k, v in _LLAMA.items() if k != "kind"},
    ),
    Family(
        "nemotron_h",
        ("nemotron_h",),
        NOPE,
        hybrid="Mamba-2 state-space, MLP and MoE layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="no positional encoding in its attention layers (NoPE); Mamba-2 layers carry position",
        **{
            **{k: v for k, v in _LLAMA.items() if k != "kind"},
            "word": "embeddings.weight",
            "query": "layers.{l}.mixer.q_proj",
            "key": "layers.{l}.mixer.k_proj",
            "pre_norm": "layers.{l}.norm",
        },
    ),  # fmt: skip
    # issue 34 (hybrid2): Zamba's shared attention blocks (families.shared_blocks); latent-attention, gated
    # DeltaNet and convolution hybrids; Inkling's relative logits (families.relative_logits)
    Family(
        "zamba",
        ("zamba",),
        NOPE,
        scaling="half_head_dim",
        hybrid="Mamba state-space layers",
        tensors={"shared_blocks": "num_mem_blocks", "concatenated_input": "embeddings"},
        capture_note=HYBRID_CAPTURE,  # through AttentionInterface from transformers 5.25 on (its eager path before)
        description="no positional encoding (NoPE) in one shared attention block over [hidden; embeddings], run "
        "between Mamba layers",
        **{
            **{k: v for k, v in _LLAMA.items() if k != "kind"},
            "query": "layers.{l}.shared_transf.self_attn.q_proj",
            "key": "layers.{l}.shared_transf.self_attn.k_proj",
            "pre_norm": "layers.{l}.shared_transf.input_layernorm",
        },
    ),  # fmt: skip
    Family(
        "zamba2",
        ("zamba2",),
        switch_kinds=(NOPE,),  # use_mem_rope off (the default): no positional term
        rotary_class=_rotary("zamba2", "Zamba2"),
        scaling="half_head_dim",
        hybrid="Mamba-2 state-space layers",
        tensors={
            "shared_blocks": "num_mem_blocks",
            "concatenated_input": "embeddings",
            "query_adapter": "layers.{l}.shared_transformer.self_attn.linear_q_adapter_list.{j}",
            "key_adapter": "layers.{l}.shared_transformer.self_attn.linear_k_adapter_list.{j}",
        },
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) or none (use_mem_rope) in shared attention blocks over [hidden; "
        "embeddings] with per-depth adapters, run between Mamba-2 layers",
        **{
            **_LLAMA,
            "query": "layers.{l}.shared_transformer.self_attn.q_proj",
            "key": "layers.{l}.shared_transformer.self_attn.k_proj",
            "pre_norm": "layers.{l}.shared_transformer.input_layernorm",
        },
    ),  # fmt: skip
    Family(
        "kimi_linear",
        ("kimi_linear",),
        NOPE,
        hybrid="Kimi Delta Attention (KDA) linear-attention layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="no positional encoding (NoPE) in its latent attention (MLA) layers, not even on the part "
        "DeepSeek rotates; KDA linear-attention layers between them",
        **{
            **{k: v for k, v in _LLAMA.items() if k != "kind"},
            "query": "layers.{l}.self_attn.(q_proj|q_a_proj)",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),  # fmt: skip
    Family(
        "bailing_hybrid",
        ("bailing_hybrid",),
        rotary_class=_rotary("bailing_hybrid", "BailingHybrid"),
        rotary_layout=HALF_INTERLEAVED,  # always interleaved pairs (no rope_interleave switch)
        scaling="latent",
        tensors={"scaling_function": "transformers.models.bailing_hybrid.modeling_bailing_hybrid:yarn_apply_mscale"},
        hybrid="KDA linear-attention layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) on the rotary part of each head of its latent attention (MLA) layers; "
        "KDA linear-attention layers between them",
        **{
            **_LLAMA,  # files: word_embeddings, layers.{l}.attention; loaded: Llama's names
            "word": "(embed_tokens|word_embeddings).weight",
            "query": "layers.{l}.(self_attn|attention).(q_proj|q_a_proj)",
            "key": "layers.{l}.(self_attn|attention).kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),  # fmt: skip
    Family(
        "lara_mini",
        ("lara_mini",),
        rotary_class=_rotary("lara_mini", "LaraMini"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="global_layers_by_type",  # the model passes rotary angles to its sliding_attention layers only
        hybrid="gated DeltaNet linear-attention layers",
        capture=EAGER,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) in its sliding-window attention layers; full-attention layers NoPE; "
        "gated DeltaNet layers between them",
        **_LLAMA,
    ),
    Family(
        "lfm3",
        ("lfm3",),
        rotary_class=_rotary("lfm3", "Lfm3"),  # one rope setting per layer type (full: proportional, partial)
        qk_norm=_QK_NORM,
        windows="layer_types",
        hybrid="gated short-convolution layers",
        capture=INTERFACE,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE), a setting per layer type, in its sliding-window and full attention "
        "layers (output-gated); short convolutions between them",
        **{**_LLAMA, "pre_norm": "layers.{l}.operator_norm"},
    ),
    Family(
        "inkling_text",
        ("inkling_text",),
        RELATIVE_LOGITS,
        causal=True,
        word="embed_tokens.weight",
        embedding_norm="embed_tokens.embed_norm",
        query="layers.{l}.self_attn.q_proj",
        key="layers.{l}.self_attn.k_proj",
        pre_norm="layers.{l}.input_layernorm",
        norm=RMSNORM,
        qk_norm=_QK_NORM,
        windows="layer_types",  # 'hybrid_sliding' layers
        tensors={
            "relative_states": "layers.{l}.self_attn.r_proj",
            "relative_profiles": "layers.{l}.self_attn.rel_logits_proj.proj",
            "key_convolution": "layers.{l}.self_attn.k_sconv.conv1d.weight",
        },
        capture=EAGER,
        description="relative logits conditioned on the hidden state (families.relative_logits) over keys through a "
        "short causal convolution; no rotary; sliding-window and log-scaled full layers",
    ),
    Family("inkling2_text", ("inkling2_text",), RELATIVE_LOGITS, **_INKLING2),
    Family(
        "inkling2_loop_text",
        ("inkling2_loop_text",),
        RELATIVE_LOGITS,
        **{
            **_INKLING2,
            "tensors": {
                **_INKLING2["tensors"],
                # layers start..end-1 run loop_num_passes times in a row: each call a depth (posprobe's layers)
                "loop": "loop_layer_index_start,loop_layer_index_end,loop_num_passes",
                "query_message_gate": "layers.{l}.(q_message_gate|controllers.attn)",  # in the passes after the first
                "key_message_gate": "layers.{l}.(k_message_gate|controllers.k)",
            },
            "description": _INKLING2["description"] + "; a block of layers run several times, with gated messages "
            "from the earlier pass (each pass's layers read as depths of their own)",
        },
    ),
    Family(
        "recurrent_gemma",
        ("recurrent_gemma",),
        rotary_class=_rotary("recurrent_gemma", "RecurrentGemma"),
        embed_scale="sqrt_hidden_bf16",
        windows="layer_types",
        hybrid="RG-LRU recurrent blocks",
        capture=INTERFACE,
        capture_note=HYBRID_CAPTURE,
        description="rotary embeddings (RoPE) on part of each head in its local attention layers; RG-LRU recurrent "
        "blocks between them",
        **{
            **_LLAMA,
            "query": "layers.{l}.temporal_block.q_proj",
            "key": "layers.{l}.temporal_block.k_proj",
            "pre_norm": "layers.{l}.temporal_pre_norm",
            "norm": RMSNORM_PLUS1,
        },
    ),  # fmt: skip
    # -- multi-head latent attention (families.latent): a rotary part and a position-free part of each head
    Family(
        "deepseek_v3",
        ("deepseek_v3",),
        rotary_class=_rotary("deepseek_v3", "DeepseekV3"),
        rotary_layout=HALF_INTERLEAVED,  # rope_interleave (the default); rotate_half when off
        switches={"rotary_layout": "rope_interleave"},
        scaling="latent",
        tensors={"scaling_function": "transformers.models.deepseek_v3.modeling_deepseek_v3:yarn_apply_mscale"},
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.(q_proj|q_a_proj)",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),  # fmt: skip
    *(
        Family(
            t,
            (t,),
            rotary_class=_rotary(t, prefix),
            rotary_layout=HALF_INTERLEAVED,  # rope_interleave; rotate_half when off
            switches={"rotary_layout": "rope_interleave"},
            scaling="latent",
            tensors={"scaling_function": f"transformers.models.{t}.modeling_{t}:yarn_apply_mscale"},
            description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free",
            **{
                **_LLAMA,
                "query": "layers.{l}.self_attn.(q_proj|q_a_proj)",
                "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
                "qkv": LATENT,
            },
        )
        for t, prefix in (("glm4_moe_lite", "Glm4MoeLite"), ("youtu", "Youtu"), ("mistral4", "Mistral4"))
    ),
    Family(
        "sarvam_mla",
        ("sarvam_mla",),
        rotary_class=_rotary("deepseek_v3", "DeepseekV3"),  # transformers runs it as DeepSeek V3
        rotary_layout=HALF_INTERLEAVED,  # rope_interleave; rotate_half when off
        switches={"rotary_layout": "rope_interleave"},
        scaling="latent",
        tensors={"scaling_function": "transformers.models.deepseek_v3.modeling_deepseek_v3:yarn_apply_mscale"},
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.(q_proj|q_a_proj)",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),
    Family(
        "axk1",
        ("axk1",),
        rotary_class=_rotary("axk1", "AXK1"),
        rotary_layout=HALF_INTERLEAVED,  # rope_interleave; rotate_half when off
        switches={"rotary_layout": "rope_interleave"},
        scaling="latent",
        tensors={"scaling_function": "transformers.models.axk1.modeling_axk1:yarn_apply_mscale"},
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.(q_proj|q_a_proj)",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),
    Family(
        "minicpm3",
        ("minicpm3",),
        rotary_class=_rotary("minicpm3", "MiniCPM3"),  # rotate_half on the rotary part
        scaling="latent",
        embed_scale="scale_emb",
        tensors={"scaling_function": "transformers.models.minicpm3.modeling_minicpm3:yarn_apply_mscale"},
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.(q_proj|q_a_proj)",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),
    Family(
        "deepseek_v2",
        ("deepseek_v2",),
        rotary_class=_rotary("deepseek_v2", "DeepseekV2"),
        rotary_layout=COMPLEX,
        scaling="latent",
        tensors={"scaling_function": "transformers.models.deepseek_v2.modeling_deepseek_v2:yarn_apply_mscale"},
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.(q_proj|q_a_proj)",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),  # fmt: skip
    # -- sparse indexed attention (issue 34; families.indexed): MLA whose softmax runs over the top-k keys an indexer
    # picks per query (DeepSeek Sparse Attention)
    *(
        Family(
            t,
            (t,),
            rotary_class=_rotary(t, prefix),
            rotary_layout=HALF_INTERLEAVED,  # the attention's rotary part; the indexer pairs its own as below
            scaling="latent",
            indexer="layers.{l}.self_attn.indexer",
            tensors={
                "scaling_function": f"transformers.models.{t}.modeling_{t}:yarn_apply_mscale",
                "indexer_rotary": layout,
            },
            description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free; "
            "each query attends the top-k keys its indexer picks",
            **{
                **_LLAMA,
                "query": "layers.{l}.self_attn.q_a_proj",
                "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
                "qkv": LATENT,
            },
        )
        for t, prefix, layout in (
            ("deepseek_v32", "DeepseekV32", ROTATE_HALF),  # its indexer rotates half-split pairs
            ("glm_moe_dsa", "GlmMoeDsa", HALF_INTERLEAVED),  # interleaved pairs; indexer_types 'shared' layers
        )
    ),  # fmt: skip
    # issue 34 (dots3): sparse indexed MLA layers beside sliding-window MLA layers of other sizes
    Family(
        "dots3_note_text",
        ("dots3_note_text",),
        rotary_class=_rotary("dots3_note", "Dots3NoteText"),  # one setting per layer type (base, rotary dims)
        rotary_layout=HALF_INTERLEAVED,  # the attention's rotary part and its indexer's: interleaved pairs
        scaling="latent",  # (r + p) ** -0.5 of each layer's own sizes, no YaRN mscale
        indexer="layers.{l}.self_attn.indexer",
        windows="layer_types",  # 'sliding_attention' layers: a causal window of config.sliding_window
        tensors={
            "indexer_rotary": HALF_INTERLEAVED,
            "latent_sizes": "per_layer_config",  # heads, ranks and head dims per layer type
            "latent_lora_scale": "sqrt_hidden_over_rank",  # normed latents times sqrt(d / rank)
            "latent_norm_eps": "config",  # the MLA block's RMSNorms at config.rms_norm_eps
            "rotary_key_norm": "k_rope_only_layernorm",  # an RMSNorm of the shared k_rot before it rotates
        },
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA), a setting and head sizes per "
        "layer type; the rest position-free; indexed layers attend the top-k keys their indexer picks, sliding "
        "layers a local window",
        capture_note="a layer type's missing query heads (per_layer_config; the release: 64 in sliding layers, 128 in "
        "the others) are NaN, no such head",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.q_a_proj",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),
    _wrapper(  # its files keep the language model at the top level ('model.layers', or 'layers' from its base model)
        "dots3_note",
        "dots3_note_text",
        towers=("vision_encoder", "audio_encoder", "audio_adapter", "vision_tower", "audio_tower"),
    ),
    Family(
        "hy_v4",
        ("hy_v4",),
        rotary_class=_rotary("hy_v4", "HYV4"),
        rotary_layout=HALF_INTERLEAVED,  # transformers 5.25: interleaved pairs, the attention's rotary part and the
        scaling="latent",  # indexer's (apply_rotary_pos_emb_interleave; rotate_half before, on the same files)
        indexer="layers.{l}.self_attn.indexer",
        sinks="layers.{l}.self_attn.(sinks|learnable_sink_param)",  # loaded: sinks; files: learnable_sink_param
        tensors={
            "scaling_function": "transformers.models.hy_v4.modeling_hy_v4:yarn_apply_mscale",
            "indexer_rotary": HALF_INTERLEAVED,
            "indexer_rope_dims": "last",  # its indexer rotates the last qk_rope_head_dim dims of each head
            "indexer_norm_eps": "config",
            # streams mixed before the input norm: loaded attn_hc.{fn, base, scale}, files hc_pre.hc_attn_layer.hc_*
            "hyper_connection": "layers.{l}.(attn_hc.|hc_pre.hc_attn_layer.hc_)",
            "hyper_connection_eps": "hc_eps",
        },
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free; "
        "each query attends the top-k keys its indexer picks; learned sinks; hyper-connection streams",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.q_a_proj",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "qkv": LATENT,
        },
    ),
    # issue 34 (dsv4): one shared key-value head, raw keys in a sliding window, pooled entries (families.shared_kv)
    Family(
        "deepseek_v4",
        ("deepseek_v4",),
        rotary_class=_rotary("deepseek_v4", "DeepseekV4"),  # one (cos, sin) per interleaved pair, a setting per rope
        rotary_layout=HALF_ANGLES,  # type; families.shared_kv puts each pair's dims i and i + r/2 (rotate_half)
        windows="sliding_window",  # every layer: raw keys i - w < j <= i
        sinks="layers.{l}.(self_attn.sinks|attn.attn_sink)",  # loaded: sinks; files: attn_sink
        tensors={
            "rope_types": "sliding_attention:main,*:compress",  # config.rope_parameters is keyed by rope type
            "pooled_keys": "compress_rates",  # compressed layers append entries pooled over blocks to the keys
            "hyper_connection": "layers.{l}.(attn_hc.|hc_attn_)",  # loaded: attn_hc.{fn, base, scale}; files hc_attn_*
            "hyper_connection_eps": "hc_eps",
        },
        capture_note="the raw keys' probabilities as the model uses them; the pooled entries' share counts with the "
        "sink's",
        description="rotary embeddings (RoPE, a setting per rope type) on each head's trailing dims, one shared "
        "key-value head, a sliding window of raw keys; learned sinks; compressed layers add pooled entries (not "
        "positions); hyper-connection streams",
        **{  # loaded names, then the files' (save_pretrained writes the released checkpoints' names)
            **_LLAMA,
            "word": "(embed_tokens|embed).weight",
            "query": "layers.{l}.(self_attn.q_a_proj|attn.wq_a)",
            "key": "layers.{l}.(self_attn.kv_proj|attn.wkv)",
            "pre_norm": "layers.{l}.(input_layernorm|attn_norm)",
            "qkv": SHARED_KV,
        },
    ),
    Family(
        "axk2",
        ("axk2",),
        rotary_class=_rotary("axk2", "AXK2"),
        rotary_layout=HALF_INTERLEAVED,  # the attention's rotary part; its indexer rotates half-split pairs
        scaling="latent",
        indexer="layers.{l}.self_attn.indexer",
        tensors={
            "scaling_function": "transformers.models.axk2.modeling_axk2:yarn_apply_mscale",
            "indexer_rotary": ROTATE_HALF,
            # a gated RMSNorm before attention: its gate's Linears as saved (W_down, W_up) and as loaded (fc1, fc2)
            "pre_norm_gate_down": "layers.{l}.input_layernorm.(W_down|mlp.fc1)",
            "pre_norm_gate_up": "layers.{l}.input_layernorm.(W_up|mlp.fc2)",
        },
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA, fused query and output gate); the "
        "rest position-free; each query attends the top-k keys its indexer picks",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.q_a_proj",
            "key": "layers.{l}.self_attn.kv_a_proj_with_mqa",
            "pre_norm": "layers.{l}.input_layernorm.norm",
            "qkv": LATENT,
        },
    ),
    # issue 34 (groups): a block indexer per key-head group (families.block_indexed)
    Family(
        "minimax_m3_vl_text",
        ("minimax_m3_vl_text",),
        rotary_class=_rotary("minimax_m3_vl", "MiniMaxM3VL"),
        qk_norm=_QK_NORM,
        indexer="layers.{l}.self_attn.indexer",
        tensors={"indexed_layer_type": "minimax_m3_sparse"},  # config.layer_types entry of its sparse layers
        capture_note="each query head attends the key blocks its key-head group picked: masks, pair counts and "
        "uniform references per head in its sparse layers",
        description="rotary embeddings (RoPE); in sparse layers each query head attends the key blocks its key-head "
        "group's indexer head picks (top-k max-pooled blocks plus local blocks)",
        **{**_LLAMA, "norm": RMSNORM_PLUS1},  # Gemma-style norms, the indexer's too
    ),
    Family("glm", ("glm",), rotary_class=_rotary("glm", "Glm"), rotary_layout=HALF_INTERLEAVED, **_LLAMA),
    # -- rotary with NoPE layers, learned sinks (issue 34: the newest position designs)
    Family(
        "smollm3",
        ("smollm3",),
        rotary_class=_rotary("smollm3", "SmolLM3"),
        windows="layer_types",
        nope="no_rope_layers",  # every fourth layer by default
        description="rotary embeddings (RoPE); NoPE layers (config.no_rope_layers)",
        **_LLAMA,
    ),
    Family(
        "cohere2",
        ("cohere2",),
        rotary_class=_rotary("cohere2", "Cohere2"),
        rotary_layout=INTERLEAVED,
        windows="layer_types",
        nope="global_layers",
        description="rotary embeddings (RoPE) in sliding-window layers; global layers NoPE",
        **{**_LLAMA, "norm": LAYERNORM},  # LayerNorm without bias
    ),
    Family(
        "cohere2_moe",
        ("cohere2_moe",),
        rotary_class=_rotary("cohere2_moe", "Cohere2Moe"),
        rotary_layout=INTERLEAVED,
        windows="layer_types",
        nope="global_layers_but_dense_prefix",
        rms_when="rms_norm_eps",
        description="rotary embeddings (RoPE) in sliding-window layers (and a dense prefix); global layers NoPE",
        **{**_LLAMA, "norm": LAYERNORM},  # LayerNorm without bias, or RMS norms (rms_norm_eps set)
    ),
    Family(
        "gpt_oss",
        ("gpt_oss",),
        rotary_class=_rotary("gpt_oss", "GptOss"),
        rotary_layout=HALF_ANGLES,
        windows="layer_types",
        sinks="layers.{l}.self_attn.sinks",
        description="rotary embeddings (RoPE, YaRN); learned per-head attention sinks",
        **_LLAMA,
    ),
    # -- issue 34 (attnvar): attention variants that needed new score code
    *(
        Family(
            t,
            (t,),
            rotary_class=_rotary(t, prefix),
            windows="layer_types",
            nope="zero_rope_theta",
            sinks="layers.{l}.self_attn.sinks",  # applied as sigmoid(logsumexp - s_h) on the output: the same weights
            tensors={"layer_rope_theta": "layer_rope_theta"},
            description="rotary embeddings (RoPE) with a base per layer (config.layer_rope_theta, 0: NoPE); "
            "learned per-head attention sinks",
            **_LLAMA,
            **_GRANITE,
        )
        for t, prefix in (("granite_swa", "GraniteSWA"), ("granitemoe_swa", "GraniteMoeSWA"))
    ),
    Family(
        "mimo_v2_flash",
        ("mimo_v2_flash",),
        rotary_class=_rotary("mimo_v2_flash", "MiMoV2Flash"),  # a rope setting (base, partial factor) per layer type
        windows="layer_types",
        sinks="layers.{l}.self_attn.sinks",  # sliding layers only
        tensors={"sliding_kv_factor": "2"},
        description="rotary embeddings (RoPE, a setting per layer type); sliding-window layers with twice the key "
        "heads and learned per-head attention sinks",
        **_LLAMA,
    ),
    Family(
        "diffllama",
        ("diffllama",),
        rotary_class=_rotary("diffllama", "DiffLlama"),
        capture_note="its softmax heads, recorded once (its second call per layer repeats them on the other half "
        "of its values)",
        description="rotary embeddings (RoPE); differential attention: output head p is softmax head p minus a "
        "learned lambda times softmax head p + H/2 (F̂ per softmax head)",
        **_LLAMA,
    ),
    Family(
        "doge",
        ("doge",),
        rotary_class=_rotary("doge", "Doge"),
        qk_norm=_QK_NORM,
        windows="sliding_window",
        tensors={
            "value": "layers.{l}.self_attn.v_proj",
            "dt_proj": "layers.{l}.self_attn.dt_proj",
            "dt_scale": "layers.{l}.self_attn.A",
        },
        description="rotary embeddings (RoPE); dynamic mask attention: a learned bias from each key's value added "
        "to its scores (beyond keep_window_size keys, only the largest-bias keys attend)",
        **_LLAMA,
    ),
    Family(
        "dory",
        ("dory",),
        rotary_class=_rotary("dory", "Dory"),  # a rope setting per layer type
        windows="layer_types",
        eps=1e-6,  # its unit-sphere norms fix it
        tensors={"unit_qk": "always", "query_channel_scale": "layers.{l}.self_attn.sqk", "mlp_layer_entries": "yes"},
        capture_note="recurrent loops > 1 run layers again: refused",
        description="rotary embeddings (RoPE); nGPT: unit-norm q and k, the rotated query rescaled per channel "
        "(sqk); a looped middle section of layers",
        **{**_LLAMA, "norm": PLAIN_L2},
    ),
    Family(
        "cohere_compass_text",
        ("cohere_compass_text",),
        rotary_class=_rotary("cohere_compass", "CohereCompass"),  # M-RoPE: text positions on every axis
        windows="layer_types",
        nope="untyped_rope",
        description="rotary embeddings (RoPE, a setting per layer type; a type without one is NoPE)",
        **{**_LLAMA, "norm": LAYERNORM},  # LayerNorm without bias
    ),
    Family(
        "beam",
        ("beam",),
        rotary_class=_rotary("beam", "Beam"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="untyped_rope",
        tensors={"nope_query_scale": "transformers.models.beam.modeling_beam:compute_attention_scaling"},
        description="rotary embeddings (RoPE) in sliding-window layers; global layers NoPE with a query scale "
        "growing with position",
        **_LLAMA,
    ),
    Family(
        "jetmoe",
        ("jetmoe",),
        rotary_class=_rotary("jetmoe", "JetMoe"),
        qkv=ROUTED_QUERY,
        eps=1e-6,  # its layer norms are built without the config's epsilon
        tensors={"router": "layers.{l}.self_attention.experts.router.layer"},
        description="rotary embeddings (RoPE); mixture of attention heads: each token's query from the experts "
        "its router picks (keys shared)",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attention.experts.input_linear",
            "key": "layers.{l}.self_attention.kv_proj",
        },
    ),
    Family(
        "persimmon",
        ("persimmon",),
        rotary_class=_rotary("persimmon", "Persimmon"),
        qk_norm=_QK_LAYERNORM,
        switches={"qk_norm": "qk_layernorm"},
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.query_key_value",
            "key": "layers.{l}.self_attn.query_key_value",
            "qkv": PER_HEAD,
            "norm": LAYERNORM,
        },
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
    Family(
        "gpt_neox_japanese",
        ("gpt_neox_japanese",),
        ROTARY,
        causal=True,
        word="embed_in.weight",
        query="layers.{l}.attention.query_key_value",  # bias-free; the dense bias comes after attention
        key="layers.{l}.attention.query_key_value",
        qkv=PER_HEAD,
        pre_norm="layers.{l}.input_layernorm",
        rotary_class=_rotary("gpt_neox_japanese", "GPTNeoXJapanese"),
        capture=EAGER,
    ),
    Family(
        "gptj",
        ("gptj",),
        query="h.{l}.attn.q_proj",
        key="h.{l}.attn.k_proj",
        rotary_class=_rotary("gptj", "GPTJ"),
        **_GPTJ,
    ),  # fmt: skip
    Family(
        "codegen",
        ("codegen",),
        query="h.{l}.attn.qkv_proj",
        key="h.{l}.attn.qkv_proj",
        qkv=BLOCKED,
        qkv_blocks=4,  # CodeGen's mp_num
        rotary_class=_rotary("codegen", "CodeGen"),
        **_GPTJ,
    ),
    Family(
        "falcon",
        ("falcon",),
        ROTARY,
        causal=True,
        switch_kinds=(ALIBI,),  # config.alibi
        word="word_embeddings.weight",
        query="h.{l}.self_attention.query_key_value",  # layout from new_decoder_architecture / multi_query
        key="h.{l}.self_attention.query_key_value",
        pre_norm="h.{l}.(ln_attn|input_layernorm)",
        rotary_class=_rotary("falcon", "Falcon"),
        tensors={"alibi": "transformers.models.falcon.modeling_falcon:build_alibi_tensor", "alibi_scaled": "yes"},
        capture=EAGER,
        capture_note="ALiBi configs read from transformers 5.25 on; before, its eager Falcon added the bias twice, "
        "unlike its sdpa, and the first-batch check refuses them",
        description="rotary embeddings or ALiBi (config.alibi)",
    ),
    Family(
        "roformer",
        ("roformer",),
        ROTARY,
        **{k: _BERT[k] for k in ("word", "token_type", "embedding_norm", "query", "key")},
        projection="embeddings_project",
        rotary_class="transformers.models.roformer.modeling_roformer:RoFormerSinusoidalPositionalEmbedding",
        rotary_layout=SIN_COS_TABLE,
        tensors={"rotary_table": "encoder.embed_positions.weight"},
        capture=EAGER,
    ),
    Family(
        "modernbert",
        ("modernbert",),
        ROTARY,
        word="embeddings.tok_embeddings.weight",
        embedding_norm="embeddings.norm",
        query="layers.{l}.attn.Wqkv",
        key="layers.{l}.attn.Wqkv",
        qkv=STACKED,
        pre_norm="layers.{l}.attn_norm",
        pre_norm_from=1,  # layer 0 reads the embedding norm's output directly
        rotary_class=_rotary("modernbert", "ModernBert"),  # one rotary setting per layer type (local / global)
        windows="layer_types_inclusive",
    ),
    # -- fused on disk, split on load (issue 34): a checkpoint's one Q/K/V projection, which transformers splits into
    # q_proj / k_proj / v_proj when it loads it (its conversion mapping); both layouts read (`stored_layout`)
    *(
        Family(
            t,
            (t,),
            ROTARY,
            word="embeddings.word_embeddings.weight",
            token_type="embeddings.token_type_embeddings.weight",  # absent where type_vocab_size is 0 (GTE)
            embedding_norm="(embeddings.LayerNorm|emb_ln)",  # files: emb_ln (Nomic BERT, Jina v3)
            query=f"{{l}}.(self_attn.q_proj|{fused})",
            key=f"{{l}}.(self_attn.k_proj|{fused})",
            qkv=STACKED,  # files: one Linear [q; k; v], chunked in three on load
            rotary_class=_rotary(module, prefix),
            description=description,
        )  # post-norm: each layer's attention reads its input itself
        for t, module, prefix, fused, description in (
            ("gte", "gte", "Gte", "attention.qkv_proj", ""),
            ("nomic_bert", "nomic_bert", "NomicBert", "attn.Wqkv", ""),
            (
                "jina_embeddings_v3",
                "jina_embeddings_v3",
                "JinaEmbeddingsV3",
                "mixer.Wqkv",
                "rotary embeddings (RoPE); the base weights (transformers' model has no task LoRA adapters)",
            ),
        )
    ),
    Family(
        "sarvam_moe",
        ("sarvam_moe", "param2moe"),  # Param2-MoE (issue 44): Sarvam-MoE's file names, its own config class (rotary
        # over whole heads); transformers runs both as GLM-4-MoE
        rotary_class=_rotary("glm4_moe", "Glm4Moe"),
        qk_norm=(
            "layers.{l}.(self_attn.q_norm|attention.query_layernorm)",
            "layers.{l}.(self_attn.k_norm|attention.key_layernorm)",
        ),  # when use_qk_norm
        switches={"qk_norm": "use_qk_norm"},
        **{
            **_LLAMA,
            "word": "(embed_tokens|word_embeddings).weight",  # files: word_embeddings
            "query": "layers.{l}.(self_attn.q_proj|attention.query_key_value)",  # files: one Linear [q; k; v]
            "key": "layers.{l}.(self_attn.k_proj|attention.query_key_value)",
            "qkv": STACKED,
        },
    ),  # fmt: skip
    Family(
        "roc_bert",
        ("roc_bert",),
        LEARNED,
        word_projection="embeddings.map_inputs_layer",  # when concat_input: [word; shape; pronunciation] -> d
        word_concat=(
            ("enable_shape", "embeddings.shape_embed.weight"),
            ("enable_pronunciation", "embeddings.pronunciation_embed.weight"),
        ),
        switches={"word_projection": "concat_input"},  # else shape and pronunciation enter only where given
        description="learned absolute table (text alone: shape and pronunciation ids 0, as its module takes them "
        "when none are given)",
        **_BERT,
    ),
    Family(
        "convbert",
        ("convbert",),
        LEARNED,
        projection="embeddings_project",
        head_ratio="head_ratio",
        reads_padding=True,
        description="learned absolute table; mixed attention: its softmax heads are read, its span-based dynamic "
        "convolution heads have no positional score",
        capture=EAGER,
        capture_note="its softmax heads (the convolution heads have no scores); texts one at a time (its "
        "convolutions read padding)",
        **_BERT,
    ),
    Family(
        "cpmant",
        ("cpmant",),
        BUCKET_BIAS,
        word="input_embedding.weight",  # the vocabulary, then prompt_types x prompt_length prompt rows
        extra_word_rows=("prompt_types", "prompt_length"),
        token_type="segment_embedding.weight",
        token_type_row=2,  # every text token's segment (0 is the prompt's and padding's)
        query="encoder.layers.{l}.self_att.self_attention.project_q",
        key="encoder.layers.{l}.self_att.self_attention.project_k",
        pre_norm="encoder.layers.{l}.self_att.layernorm_before_attention",
        norm=RMSNORM,
        reads_padding=True,  # it takes token 0 for padding and masks as if padded on the left
        tensors={
            "relative_bias": "position_bias.relative_attention_bias",  # (buckets + segments², heads)
            "num_buckets": "position_bias_num_buckets",
            "max_distance": "position_bias_max_distance",
            "segment_rows": "segment_types",  # a bias per (query segment, key segment) after the buckets
            "prompt_tokens": "prompt_length",
        },
        description="relative position buckets (learned bias) within a segment (text: one segment); its prompt "
        "tokens before the text are further keys, not analysed (transformers' module attends both ways)",
        capture=EAGER,
        capture_note="configs without prompt tokens (prompt_length 0); texts one at a time",
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
        capture=EAGER,
    ),
    Family(
        "ctrl",
        ("ctrl",),
        SINUSOIDAL,
        causal=True,
        word="w.weight",
        embed_scale="sqrt_hidden",  # the words alone, by sqrt(d); the sin | cos table is added unscaled
        eps=1e-6,  # its layers' LayerNorms (config.layer_norm_epsilon is the final norm's)
        query="h.{l}.multi_head_attention.Wq",
        key="h.{l}.multi_head_attention.Wk",
        pre_norm="h.{l}.layernorm1",
        tensors={"positions_function": "transformers.models.ctrl.modeling_ctrl:positional_encoding"},
        description="sinusoidal absolute positions (not learned): [sin | cos] halves, added to sqrt(d)-scaled words",
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
        capture=EAGER,
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
        tensors={"alibi": "build_mpt_alibi_tensor"},  # MPT's bias code (posprobe.families.alibi), not BLOOM's
        capture=EAGER,
    ),
    # -- bucketed relative bias (posprobe.families.relative_bias): 'relative_bias' names the (buckets, heads) table
    Family("t5", ("t5", "mt5"), tensors={"relative_bias": _T5_BIAS.replace("{l}", "0")}, **_T5),  # layer 0's, for all
    Family("umt5", ("umt5",), tensors={"relative_bias": _T5_BIAS}, **_T5),  # one table per layer
    Family(
        "longt5",
        ("longt5",),
        windows="local_radius",  # the encoder attends |j - i| <= local_radius (transient-global: plus side keys)
        tensors={"relative_bias": _T5_BIAS.replace("{l}", "0").replace("SelfAttention", _LONGT5_ATTENTION)},
        **{
            **_T5,
            "query": _T5["query"].replace("SelfAttention", _LONGT5_ATTENTION),
            "key": _T5["key"].replace("SelfAttention", _LONGT5_ATTENTION),
            "capture": REFUSED,
            "capture_note": "blockwise local attention",
        },
    ),  # fmt: skip
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
        capture=EAGER,
    ),
    # -- disentangled (posprobe.families.disentangled); without relative_attention their absolute table is all
    Family(
        "deberta-v2",
        ("deberta-v2",),
        DISENTANGLED,
        switch_kinds=(LEARNED,),
        word=_BERT["word"],
        position=_BERT["position"],  # only when position_biased_input (not in v3)
        switches={"position": "position_biased_input"},
        token_type=_BERT["token_type"],
        embedding_norm=_BERT["embedding_norm"],
        projection="embeddings.embed_proj",
        projection_first=True,
        query="encoder.layer.{l}.attention.self.query_proj",
        key="encoder.layer.{l}.attention.self.key_proj",
        scaling="disentangled",
        tensors={
            "rel_embeddings": "encoder.rel_embeddings.weight",
            "rel_norm": "encoder.LayerNorm",  # applied when norm_rel_ebd has 'layer_norm'
            "pos_query": "encoder.layer.{l}.attention.self.pos_query_proj",  # without share_att_key
            "pos_key": "encoder.layer.{l}.attention.self.pos_key_proj",
        },
        description="disentangled relative positions (relative_attention off: its learned absolute table)",
        capture=EAGER,
    ),
    Family(
        "deberta",
        ("deberta",),
        DISENTANGLED,
        switch_kinds=(LEARNED,),
        word=_BERT["word"],
        position=_BERT["position"],
        switches={"position": "position_biased_input"},
        token_type=_BERT["token_type"],
        embedding_norm=_BERT["embedding_norm"],
        projection="embeddings.embed_proj",
        projection_first=True,
        query="encoder.layer.{l}.attention.self.in_proj",  # fused, rows per head [q_h; k_h; v_h]
        key="encoder.layer.{l}.attention.self.in_proj",
        qkv=PER_HEAD,
        scaling="disentangled",
        tensors={
            "q_bias": "encoder.layer.{l}.attention.self.q_bias",  # the query's bias, stored apart
            "rel_embeddings": "encoder.rel_embeddings.weight",  # v1: no LayerNorm, no log buckets
            "pos_query": "encoder.layer.{l}.attention.self.pos_q_proj",
            "pos_key": "encoder.layer.{l}.attention.self.pos_proj",
            "head_logits": "encoder.layer.{l}.attention.self.head_logits_proj",  # talking heads, when stored
            "scale_terms": "pos_att_type",  # the scale counts every listed term (v2: c2p and p2c only)
        },
        description="disentangled relative positions, v1 layout (relative_attention off: its learned absolute table)",
        capture=EAGER,
        capture_note="talking-head configs refused (heads mixed after the softmax)",
    ),
    # -- known, not analysed
    Family("speech_to_text", ("speech_to_text",), SINUSOIDAL),  # audio input: no word table to average
    Family(
        "xlm",
        ("xlm", "flaubert"),
        LEARNED,
        word="embeddings.weight",
        position="position_embeddings.weight",  # learned, or filled with sinusoids (sinusoidal_embeddings): stored
        embedding_norm="layer_norm_emb",
        query="attentions.{l}.q_lin",
        key="attentions.{l}.k_lin",
        description="learned absolute table (language embeddings only where the input gives languages)",
        capture=EAGER,
    ),
    # -- sinusoidal relative positions (posprobe.families.relative_sinusoidal)
    Family(
        "xlnet",
        ("xlnet",),
        RELATIVE_SINUSOIDAL,
        word="word_embedding.weight",
        query="layer.{l}.rel_attn.q",  # (d, H, d_h) parameters; post-norm layers: no norm before attention
        key="layer.{l}.rel_attn.k",
        value="layer.{l}.rel_attn.v",
        qkv=HEAD_TENSOR,
        tensors={
            "position_projection": "layer.{l}.rel_attn.r",  # W_R (d, H, d_h): keys of the relative encodings
            "content_bias": "layer.{l}.rel_attn.r_w_bias",  # u (H, d_h), added to q against the content keys
            "position_bias": "layer.{l}.rel_attn.r_r_bias",  # v (H, d_h), added to q against the position keys
            "clamp": "clamp_len",  # relative distances clamped to +-clamp_len where it is > 0
            "encodings": "float32",  # the sinusoids are built in float32 whatever the weights' dtype
        },
        description="sinusoidal relative positions (Transformer-XL style; two-stream: the content stream is read)",
        capture=EAGER,
        capture_note="its content stream",
    ),
    Family(
        "funnel",
        ("funnel",),
        RELATIVE_SINUSOIDAL,
        word="embeddings.word_embeddings.weight",
        embedding_norm="embeddings.layer_norm",
        query="encoder.blocks.0.{l}.attention.q_head",  # the first block's layers: the only ones at full length
        key="encoder.blocks.0.{l}.attention.k_head",
        value="encoder.blocks.0.{l}.attention.v_head",
        tensors={
            "position_projection": "encoder.blocks.0.{l}.attention.r_kernel",
            "content_bias": "encoder.blocks.0.{l}.attention.r_w_bias",
            "position_bias": "encoder.blocks.0.{l}.attention.r_r_bias",
            "segment_bias": "encoder.blocks.0.{l}.attention.r_s_bias",
            "segment_embedding": "encoder.blocks.0.{l}.attention.seg_embed",  # (2, H, d_h): [different; same]
            "same_segment": "1",  # token types default to zeros: one segment, always added
            "cls_apart": "separate_cls",  # no position or segment term in the <cls> row and column (position 0)
            "encodings": "float64",  # built in the model's dtype (XLNet: float32)
            "pooled_blocks": "block_sizes",  # layers per block, the sequence pooled by 2 before each later one
            "block_repeats": "block_repeats",  # runs of each layer of a block (capture.pooled)
        },
        decoder_stack=dict(  # FunnelModel's upsampling decoder: full length again, the first block's positions
            causal=False,
            query="decoder.layers.{l}.attention.q_head",
            key="decoder.layers.{l}.attention.k_head",
            value="decoder.layers.{l}.attention.v_head",
            sizes={"layers": ("num_decoder_layers",)},
            tensors={
                "position_projection": "decoder.layers.{l}.attention.r_kernel",
                "content_bias": "decoder.layers.{l}.attention.r_w_bias",
                "position_bias": "decoder.layers.{l}.attention.r_r_bias",
                "segment_bias": "decoder.layers.{l}.attention.r_s_bias",
                "segment_embedding": "decoder.layers.{l}.attention.seg_embed",
                "same_segment": "1",
                "cls_apart": "separate_cls",
                "encodings": "float64",
            },
        ),
        description="sinusoidal relative positions; the sequence is pooled by 2 between blocks: the first block's "
        "layers are read; a later block b is not: its queries sit on pooled positions of their own (every 2^b-th, "
        "<cls> moved to 1 - 2^b with separate_cls) and its first layer attends them to the previous block's keys "
        "(pool_q_only): matrices of other shapes and positions than the n x n over positions 0..n-1 of posprobe's "
        "per-layer results; --stack decoder: FunnelModel's upsampling decoder layers, at full length, read as the "
        "first block's",
        capture=EAGER,
        capture_note="its first block's layers, each module's own softmax; later blocks and the upsampling decoder "
        "listed: no positional score; hidden states refused (pooled lengths)",
    ),
    # -- rotary / latent designs of their own (issue 34): attention sublayers, mixed layer inputs, convolutional q/k,
    # stacks run in cycles
    Family(
        "longcat_flash",
        ("longcat_flash",),
        rotary_class=_rotary("longcat_flash", "LongcatFlash"),
        rotary_layout=HALF_INTERLEAVED,  # always interleaved pairs
        sublayers=2,  # self_attn[0] and self_attn[1] of every layer: posprobe's layers 2l and 2l + 1
        scaling="latent",
        tensors={
            "scaling_function": "transformers.models.longcat_flash.modeling_longcat_flash:yarn_apply_mscale",
            "latent_prefix": "layers.{l}.self_attn.{s}.",
            "latent_lora_scale": "sqrt_hidden_over_rank",  # q * sqrt(d / q_lora_rank), k_pass * sqrt(d / kv rank)
        },
        description="rotary embeddings (RoPE) on the rotary part of each head (MLA); the rest position-free; two "
        "latent attention sublayers per layer, each read as a layer of its own",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.{s}.q_a_proj",
            "key": "layers.{l}.self_attn.{s}.kv_a_proj_with_mqa",
            "pre_norm": "layers.{l}.input_layernorm.{s}",
            "qkv": LATENT,
        },
    ),
    Family(
        "neomme",
        ("neomme",),
        rotary_class=_rotary("neomme", "NeoMME"),  # per layer type; two M-RoPE axes, equal for text
        word_projection="embed_tokens.embedding_projection",  # factorised: rank -> hidden, no bias
        embedding_norm="embedding_norm",
        qk_norm=("layers.{l}.self_attn.q_norm", "layers.{l}.self_attn.k_norm"),  # weightless, before RoPE
        windows="per_layer_config",
        tensors={"input_mix": "layers.{l}.lambdas"},  # the layer reads lambda_0 h + lambda_1 x_0 (x_0: embeddings)
        description="rotary embeddings (RoPE; two M-RoPE axes, the same position for text), a setting per layer "
        "type; value embeddings and exclusive self-attention act after the softmax",
        **{**_LLAMA, "norm": PLAIN_RMSNORM, "causal": False, "word": "embed_tokens.word_embeddings.weight"},
    ),
    Family(
        "zaya",
        ("zaya",),
        rotary_class=_rotary("zaya", "Zaya"),  # one setting per layer type (partial rotary)
        windows="layer_types",  # 'hybrid_sliding' layers: a causal window of sliding_window
        tensors={
            "input_affine": "(input_hidden_states_bias|input_hidden_states_scale)",  # (e + b) * s before the layers
            "conv_depthwise": "layers.{l}.self_attn.qkv_proj.conv_qk_depthwise",
            "conv_grouped": "layers.{l}.self_attn.qkv_proj.conv_qk_grouped",
            "key_temperature": "layers.{l}.self_attn.qk_norm.temp",
        },
        description="rotary embeddings (RoPE) on queries and keys mixed by causal convolutions over the sequence "
        "(compressed convolutional attention: the first positions' q and k differ), a setting per layer type",
        **{
            **_LLAMA,
            "query": "layers.{l}.self_attn.qkv_proj.q_proj",
            "key": "layers.{l}.self_attn.qkv_proj.k_proj",
            "value": "layers.{l}.self_attn.qkv_proj.v_proj_current",
            "qkv": CCA,
        },
    ),
    Family(
        "hrm_text",
        ("hrm_text",),
        rotary_class=_rotary("hrm_text", "HrmText"),
        embed_scale="embedding_scale",
        cycles=("num_layers_per_stack", "L_cycles"),  # two stacks of layers, each run again and again
        tensors={"fused_on_disk": "{m}_module.layers.{l}.attn.gqkv_proj.weight", "fused_parts": "gate,q,k,v"},
        description="rotary embeddings (RoPE); two stacks of layers run in hierarchical cycles (each stored layer "
        "at several depths, read on the embedding-level input at each)",
        **{
            **_LLAMA,
            "norm": PLAIN_RMSNORM,
            "query": "{m}_module.layers.{l}.self_attn.q_proj",
            "key": "{m}_module.layers.{l}.self_attn.k_proj",
            "value": "{m}_module.layers.{l}.self_attn.v_proj",
            "pre_norm": "{m}_module.layers.{l}.input_layernorm",
        },
    ),
    # issue 34 (blt): stacks run one after another (families.stacked)
    Family(
        "blt",
        ("blt",),
        ROTARY,
        causal=True,
        word="local_encoder.embed_tokens.weight",  # plus the average row of each hashed n-gram table (tensors)
        query="{m}.layers.{l}.self_attn.q_proj",
        key="{m}.layers.{l}.self_attn.k_proj",
        value="{m}.layers.{l}.self_attn.v_proj",
        pre_norm="{m}.layers.{l}.input_layernorm",
        norm=RMSNORM,
        rotary_class="posprobe.families.stacked:StackRotary",  # each stack's own module (tensors['stack_rotary'])
        rotary_layout=INTERLEAVED,
        stacks=(
            ("local_encoder", "encoder_config", True),
            ("global_transformer", "global_config", False),
            ("local_decoder", "decoder_config", True),
        ),
        sizes={
            "hidden": ("encoder_config.hidden_size",),
            "heads": ("encoder_config.num_attention_heads",),
            "kv_heads": ("encoder_config.num_key_value_heads",),
            "eps": ("encoder_config.rms_norm_eps",),
            "vocab": ("encoder_config.vocab_size",),
            "positions": ("encoder_config.max_position_embeddings",),
        },
        windows="stack_window",
        hybrid="global-transformer layers (softmax over patch positions, not the text's; their input is pooled from "
        "the bytes: no content-free input)",
        tensors={
            "stack_rotary": _rotary("blt", "Blt"),
            "window": "local_attention_window_len",
            "hash_words": "encoder_hash_tok_embedding.weight",
            "hash_vocab": "encoder_hash_byte_group_vocab",
        },
        capture=EAGER,
        capture_note=HYBRID_CAPTURE + " (its global layers over patches); its byte layers' own modules recorded, "
        "patches as its config picks them (entropy model or one per byte); hidden states refused",
        description="rotary embeddings (RoPE, interleaved pairs) in a byte encoder and a byte decoder, a setting per "
        "stack, in a causal byte window, around a global transformer over patches (no positional score); "
        "cross-attention between bytes and patches has none; the average input adds each hashed n-gram table's "
        "average row",
    ),
    # -- transformers 5.25's new types (issue 44)
    Family(
        "minicpm5_moe",
        ("minicpm5_moe",),
        rotary_class=_rotary("minicpm5_moe", "MiniCPM5Moe"),
        description="rotary embeddings (RoPE); a sigmoid output gate per head from the query projection",
        **{**_LLAMA, "query": "layers.{l}.self_attn.(q_proj|q_gate_proj)", "qkv": GATED_QUERY},  # files: q_proj
    ),
    Family(
        "ergo",
        ("ergo",),
        rotary_class=_rotary("ergo", "Ergo"),  # a rope setting per layer type; none for its full layers
        rotary_layout=INTERLEAVED,
        qk_norm=("layers.{l}.(self_attn|attention).q_norm", "layers.{l}.(self_attn|attention).k_norm"),
        windows="layer_types",
        nope="untyped_rope",
        tensors={"global_scale": "global_attention_scale"},
        description="rotary embeddings (RoPE, interleaved pairs) in sliding-window layers; global layers NoPE, "
        "their logits times global_attention_scale where the config sets one",
        **{
            **_LLAMA,
            "word": "(embed_tokens|tok_embeddings).weight",  # files: tok_embeddings, attention.wqkv, attention_norm
            "query": "layers.{l}.(self_attn.qkv_proj|attention.wqkv)",  # one Linear [q; k; v]
            "key": "layers.{l}.(self_attn.qkv_proj|attention.wqkv)",
            "pre_norm": "layers.{l}.(input_layernorm|attention_norm)",
            "qkv": STACKED,
        },
    ),  # fmt: skip
    Family(
        "kolibri1_1",
        ("kolibri1_1",),
        rotary_class=_rotary("kolibri1_1", "Kolibri1_1"),
        qk_norm=_QK_NORM,
        windows="layer_types",
        nope="global_layers_by_type",  # its indexed layers
        indexer="layers.{l}.self_attn.indexer",  # no weights: it scores keys with the layer's own query heads
        tensors={
            "indexer_picks": "sinks_local_topk",
            "key_rounding": "transformers.models.kolibri1_1.modeling_kolibri1_1:nvfp4_fake_quantize",
            "kv_sharing": "kv_sharing_modes",
            "kv_sources": "kv_source_layers",
        },
        description="rotary embeddings (RoPE) in sliding-window layers; NoPE indexed layers that attend sink, local "
        "and top-k keys (NVFP4-rounded), some reading an earlier indexed layer's keys and values",
        **_LLAMA,
    ),
    # -- no softmax attention in any layer: nothing for posprobe's scores to read (refused in one line)
    Family(
        "mamba",
        ("mamba", "mamba2", "falcon_mamba"),
        OTHER,
        causal=True,
        softmax_attention=False,
        description="no softmax attention: a selective state-space recurrence carries position",
    ),
    Family(
        "rwkv",
        ("rwkv",),
        OTHER,
        causal=True,
        softmax_attention=False,
        description="no softmax attention: a linear recurrence with learned per-channel decay carries position",
    ),
    Family(
        "xlstm",
        ("xlstm",),
        OTHER,
        causal=True,
        softmax_attention=False,
        description="no softmax attention: recurrent memory cells (sLSTM / mLSTM) carry position",
    ),
    Family(
        "fnet",
        ("fnet",),
        OTHER,
        softmax_attention=False,
        description="no attention: Fourier transforms mix the tokens (a learned absolute table feeds them)",
    ),
    Family(
        "yoso",
        ("yoso",),
        OTHER,
        softmax_attention=False,
        description="no softmax attention: LSH-sampled Bernoulli attention weights (a learned absolute table feeds "
        "them)",
    ),
    Family(
        "nystromformer",
        ("nystromformer",),
        OTHER,
        softmax_attention=False,
        description="no token-by-token softmax attention: a Nystrom approximation through landmark means (a learned "
        "absolute table feeds it)",
    ),
    Family(
        "mra",
        ("mra",),
        OTHER,
        softmax_attention=False,
        description="no token-by-token softmax attention: a multi-resolution block approximation of it (a learned "
        "absolute table feeds it)",
    ),
    Family(
        "perceiver",
        ("perceiver",),
        OTHER,
        softmax_attention=False,
        description="no token-by-token softmax attention: a latent array cross-attends to the tokens (a learned "
        "absolute table feeds it)",
    ),
)

FAMILIES = tuple(_read_as_language_model(f, FAMILIES) for f in FAMILIES)
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


def stack_family(family: Family, stack: str) -> Family:
    """The entry as it reads `stack`: for the decoder of a model whose decoder has fields of its own
    (`Family.decoder_stack`), the entry with them, read as one stack, causal unless they say otherwise (Funnel's
    upsampling decoder); else the entry itself."""
    if stack != "decoder" or not family.decoder_stack:
        return family
    return replace(family, **{"causal": True, **family.decoder_stack, "encoder_decoder": False, "decoder_stack": {}})


def stack_sizes(family: Family, config: dict) -> dict:
    """`config` with the sizes of the stack the family reads put under the first `CONFIG_KEYS` name of each
    (`Family.sizes`: Whisper's decoder_layers, decoder_attention_heads, max_target_positions); `config` itself
    when the family names none or the config has none of them."""
    out = None
    if family.stacks:  # stacks run one after another (BLT): posprobe's layers are all of theirs, in that order
        out = {k: v for k, v in config.items() if k not in CONFIG_KEYS["layers"]}
        out["num_hidden_layers"] = len(stack_depths(family, config))
    for what, keys in family.sizes.items():
        value = next((config_get(config, k) for k in keys if config_get(config, k) is not None), None)
        if value is not None:
            out = {k: v for k, v in (out or config).items() if k not in CONFIG_KEYS[what]}
            out[CONFIG_KEYS[what][0]] = value
    return config if out is None else out


def config_get(config: dict, key: str):
    """config[key], where a dotted key names a field of a nested section ('attn_config.clip_qkv': DBRX) or an entry
    of a list ('block_sizes.0': Funnel's first block); None when absent."""
    value = config
    for part in key.split("."):
        if isinstance(value, list) and part.isdigit():
            value = value[int(part)] if int(part) < len(value) else None
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def softmax_heads(family: Family, config: dict, heads: int) -> int:
    """The heads of each layer that attend by softmax over q.k: all `heads`, or a mixed attention's
    heads // config[`Family.head_ratio`], at least one (ConvBERT; missing keys: its config class's default)."""
    if family.head_ratio is None:
        return heads
    ratio = config_get(config, family.head_ratio)
    ratio = ratio if ratio is not None else config_default(config, (family.head_ratio,))
    return max(heads // int(ratio), 1)


def config_value(config: dict, what: str):
    """The first of `CONFIG_KEYS[what]` present (not None) in `config` (dotted keys: nested sections), or None; a
    list of per-layer entries gives its length."""
    for key in CONFIG_KEYS[what]:
        value = config_get(config, key)
        if value is not None:
            return len(value) if isinstance(value, list) and what == "layers" else value
    return None


def table_model_types() -> tuple[str, ...]:
    """Model types with an absolute position table posprobe reads (learned, or sinusoidal as the model builds it)."""
    return tuple(t for kind in TABLE_KINDS for t in model_types(kind=kind, analysable=True))


def config_default(config: dict, keys: tuple[str, ...]):
    """The first of `keys` set in the default config of `config`'s model type (transformers' config class), or
    None: what the model itself would use for a field its config.json leaves out."""
    try:
        from transformers import AutoConfig

        defaults = AutoConfig.for_model(str(config.get("model_type")))
    except Exception:  # an unknown model type: no defaults to offer
        return None
    return next((getattr(defaults, k) for k in keys if getattr(defaults, k, None) is not None), None)


def config_flag(config: dict, key: str) -> bool:
    """Config switch `key` as the model reads it: the config's value, else its config class's default."""
    value = config.get(key)
    return bool(value if value is not None else config_default(config, (key,)))


def is_causal(family: Family, config: dict) -> bool:
    """True when the model `config` describes lets query i see only keys j <= i (its one stack, or a decoder-only
    model): the entry's `causal`, unless its `bidirectional` config switch is on (Gemma 3) or its
    `tensors['causal_when']` switch is off (Reformer's is_decoder)."""
    if family.causal and family.bidirectional and config_flag(config, family.bidirectional):
        return False
    if "causal_when" in family.tensors:
        return config_flag(config, family.tensors["causal_when"])
    return family.causal


def switched_on(family: Family, config: dict, what: str) -> bool:
    """True when table field `what` applies to the model `config` describes (`Family.switches`)."""
    key = family.switches.get(what)
    return key is None or config_flag(config, key)


def position_kind(config: dict) -> tuple[str, str]:
    """(kind, mechanism in words) of the model `config` describes, config switches included (DistilBERT's
    `sinusoidal_pos_embds`, BERT-style `position_embedding_type`, ESM's rotary, Falcon's `alibi`, DeBERTa's
    `relative_attention`); OTHER for unknown types."""
    model_type = str(config.get("model_type", "unknown"))
    family = family_for_type(model_type)
    if family is None:
        return OTHER, f"unknown (posprobe does not know how '{model_type}' encodes positions)"
    if model_type == "distilbert" and config.get("sinusoidal_pos_embds"):
        return SINUSOIDAL, KIND_NAMES[SINUSOIDAL]
    pos_type = config.get("position_embedding_type", "absolute")
    if model_type == "esm" and pos_type == "rotary":
        return ROTARY, KIND_NAMES[ROTARY]
    if family.kind == LEARNED and pos_type not in (None, "absolute"):
        return OTHER, f"position_embedding_type='{pos_type}' (relative positions), not a learned absolute table"
    if family.kind == DISENTANGLED and not config.get("relative_attention", False):
        if config.get("position_biased_input", True):
            return LEARNED, "learned absolute table (relative_attention off)"
        return OTHER, "no position information (relative_attention and position_biased_input both off)"
    if model_type == "falcon":
        return (ALIBI, KIND_NAMES[ALIBI]) if config.get("alibi") else (ROTARY, KIND_NAMES[ROTARY])
    if model_type == "granitemoehybrid" and config.get("position_embedding_type") != "rope":
        return NOPE, "no positional encoding in its attention layers (position_embedding_type not 'rope')"
    if model_type == "zamba2" and not config_flag(config, "use_mem_rope"):
        return NOPE, "no positional encoding in its shared attention blocks (use_mem_rope off)"
    if model_type == "mobilebert" and config.get("normalization_type", "no_norm") != "no_norm":
        return OTHER, (
            "a learned absolute table behind LayerNorm bottlenecks (normalization_type "
            f"'{config.get('normalization_type')}'; posprobe reads MobileBERT's 'no_norm', as released)"
        )
    if model_type in ("gemma4_text", "gemma4_unified_text") and config.get("use_bidirectional_attention") == "all":
        return OTHER, (
            "rotary embeddings in bidirectional layers (use_bidirectional_attention 'all'; posprobe reads the causal "
            "Gemma 4 text models)"
        )
    if model_type == "flaubert" and config.get("pre_norm"):
        return OTHER, (
            "a learned absolute table in pre-norm layers (pre_norm; transformers' own FlauBERT does not run such "
            "configs, so there is no module to check a reading against; posprobe reads the post-norm ones)"
        )
    if model_type == "trocr" and not config_flag(config, "use_learned_position_embeddings"):
        return SINUSOIDAL, KIND_NAMES[SINUSOIDAL]
    if model_type == "xlnet" and (config.get("attn_type", "bi") != "bi" or config.get("bi_data")):
        return OTHER, (
            "sinusoidal relative positions with attn_type 'uni' or bi_data (pretraining settings; posprobe reads "
            "attn_type 'bi' without bi_data, as released)"
        )
    if model_type == "funnel" and (config.get("block_repeats") or [1])[0] != 1:
        return OTHER, "sinusoidal relative positions in repeated (weight-shared) layers (block_repeats not 1)"
    if family.switch_kinds:  # the config has picked one of the family's kinds: name that one
        return family.kind, KIND_NAMES[family.kind]
    return family.kind, family.mechanism


CROSS_ATTENTION = "cross_attention"  # the layer type of a hybrid's layers listed by `Family.hybrid_layers`


def stack_depths(family: Family, config: dict) -> list[tuple[str, bool, int]]:
    """(module, whether its positions are the text's, stored layer) of every depth of a family whose stacks run one
    after another (`Family.stacks`), in the order the model runs them; each stack's layer count is its config
    section's num_hidden_layers (its config class's default where the section leaves it out)."""
    depths = []
    for module, section, read in family.stacks:
        count = config_get(config, f"{section}.num_hidden_layers")
        if count is None:
            count = getattr(getattr(_default_config(config), section, None), "num_hidden_layers", 0)
        depths += [(module, read, layer) for layer in range(int(count or 0))]
    return depths


def _default_config(config: dict):
    try:
        from transformers import AutoConfig

        return AutoConfig.for_model(str(config.get("model_type")))
    except Exception:  # an unknown model type: no defaults to offer
        return None


STACK_PATCHES = "patches"  # the layer type of a stack over positions other than the text's (`Family.stacks`)


def layer_types(family: Family, config) -> list[str]:
    """The layer types of the model a transformers `config` object describes: config.layer_types (or the config list
    `Family.tensors['layer_types']` names: Reformer's attn_layers), or where the family lists its other layers by
    index (`hybrid_layers`), `CROSS_ATTENTION` there and 'full_attention' elsewhere; a family of stacks run one after
    another (`stacks`): 'sliding_attention' in its stacks over the text's positions (BLT's byte stacks, windowed),
    `STACK_PATCHES` in the others."""
    if family.stacks:
        settings = {**config.to_dict(), "model_type": config.model_type}
        local = "sliding_attention" if config_get(settings, family.tensors["window"]) else "full_attention"
        return [local if read else STACK_PATCHES for _, read, _ in stack_depths(family, settings)]
    if family.hybrid_layers:
        others = set(getattr(config, family.hybrid_layers, None) or [])
        return [CROSS_ATTENTION if layer in others else "full_attention" for layer in range(config.num_hidden_layers)]
    return list(getattr(config, family.tensors.get("layer_types", "layer_types"), None) or [])


def language_model_config(config: dict) -> dict:
    """The config of the language model the model `config` describes: a multimodal wrapper's nested one (its model
    type set), or `config` itself (also where a wrapper's config lacks the nested one: callers refuse that)."""
    family = family_for_type(str(config.get("model_type", "unknown")))
    if family is None or family.language_model is None or not isinstance(config.get(family.language_model[0]), dict):
        return config
    key, _, text = family.language_model
    return {**config[key], "model_type": text}


def has_learned_table(config: dict) -> bool:
    """True when the model `config` describes stores a learned absolute position table: its kind is LEARNED, or
    a table beside a relative mechanism (MPNet, DeBERTa with position_biased_input)."""
    family = family_for_type(str(config.get("model_type", "unknown")))
    kind = position_kind(config)[0]
    if family is None or kind in (SINUSOIDAL, OTHER):
        return False
    if kind == LEARNED:
        return True
    return family.kind not in TABLE_KINDS and family.position is not None and switched_on(family, config, "position")


def norm_kind(family: Family, config: dict) -> str:
    """The kind of the norms of the model `config` describes: the entry's `norm`, or RMS where its `rms_when` key
    is set."""
    return RMSNORM if family.rms_when and config_get(config, family.rms_when) is not None else family.norm


def qkv_layout(family: Family, config: dict) -> tuple[str, int | None]:
    """(Q/K/V layout, key heads or None for the config's own count) of the model `config` describes: the entry's
    `qkv`, except where a config switch changes it (Falcon: new_decoder_architecture groups rows per key head,
    multi_query stacks one key head after the queries, else rows per head; GPT-BigCode's multi_query likewise)."""
    if config.get("model_type") == "falcon":
        if config_flag(config, "new_decoder_architecture"):
            return KV_GROUPED, None
        return (STACKED, 1) if config_flag(config, "multi_query") else (PER_HEAD, None)
    if config.get("model_type") == "gpt_bigcode":
        return (STACKED, 1) if config_flag(config, "multi_query") else (PER_HEAD, None)
    return family.qkv, None


def rotary_layout(family: Family, config: dict) -> str:
    """How the model `config` describes pairs its rotated dims: the entry's `rotary_layout`, or rotate_half where
    the config switch that selects it is off (DeepSeek V3's rope_interleave)."""
    return family.rotary_layout if switched_on(family, config, "rotary_layout") else ROTATE_HALF


# rotary modules with one setting per layer type
_PER_TYPE_ROPE = ("gemma3_text", "modernbert", "olmo3", "mellum", "ultrabert", "lfm3", "mimo_v2_flash", "dory",
                  "cohere_compass_text", "beam", "neomme", "zaya")  # fmt: skip
_PER_TYPE_ROPE += ("gemma3n_text", "gemma4_text", "gemma4_unified_text")
_PER_TYPE_ROPE += ("laguna",)  # issue 34 (heads)
_PER_TYPE_ROPE += ("deepseek_v4",)  # issue 34 (dsv4): a setting per rope type
_PER_TYPE_ROPE += ("ergo",)  # issue 44
_CHUNKED = ("llama4_text",)  # layer_types 'chunked_attention': chunks rather than sliding windows


def _capture_words(f: Family) -> str:
    """How `attention` records the family, for the table of families (docs/families.md)."""
    if not f.analysable:
        return "not tested"
    words = {INTERFACE: "AttentionInterface", EAGER: "eager path", REFUSED: "refused"}[f.capture]
    return words + (f" ({f.capture_note})" if f.capture_note else "")


def _layer_kind_words(f: Family) -> str:
    """The kinds of layer the family can have, for the table of families (`windows.LayerKind` says them per layer)."""
    if not f.softmax_attention:
        return "no softmax attention (refused)"
    if f.draft_of:
        return f"attends {f.draft_of}'s keys and values (refused)"
    if not f.analysable:
        return "—"
    kinds = {ROTARY: ["rope"], NOPE: ["NoPE"], ALIBI: ["ALiBi bias"], BUCKET_BIAS: ["bucket bias"],
             DISENTANGLED: ["disentangled"], RELATIVE_LOGITS: ["relative logits"],
             RELATIVE_SINUSOIDAL: ["sinusoidal relative"]}.get(
                 f.kind, ["absolute table"])  # fmt: skip
    if f.qkv == LATENT:
        kinds = ["MLA: rotary part + position-free part"] if f.kind != NOPE else ["NoPE (MLA)"]
    if (f.language_model[2] if f.language_model else f.name) in _PER_TYPE_ROPE:  # a wrapper: its language model's
        kinds[0] += " (a setting per layer type)"
    if f.nope:
        kinds.append("NoPE layers")
    if f.windows:
        kinds.append(
            {
                "block_sparse": "block-sparse",
                "attention_window": "sliding chunks",
                "neighbour_chunks": "local chunks (own and neighbours)",
            }.get(f.windows, "local window")
        )
    if f.sinks:
        kinds.append("learned sinks")
    if f.indexer:
        kinds.append("indexed (top-k)")
    if "pooled_keys" in f.tensors:
        kinds.append("pooled entries beside the keys (no positional score)")
    if f.hybrid:
        kinds.append(f"{f.hybrid} (no positional score)")
    if f.head_ratio:
        kinds.append("span-convolution heads beside the softmax ones (no positional score)")
    return " / ".join(kinds)


def families_markdown() -> str:
    """The table of families that scripts/docs_pages.py writes into docs/families.md (tests check the page is this)."""
    rows = [
        "| family | model types | positions | layer kinds | causal | posprobe computes | `attention` on text |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        table = f.learned_table or any(k in TABLE_KINDS for k in f.kinds)
        if not f.analysable:
            does = "named in messages; `params`" + (" counts its table" if f.learned_table else "")
            does = does if f.softmax_attention and not f.draft_of else "refused in one line"
        elif all(k in TABLE_KINDS for k in f.kinds):
            does = "`toeplitz`, `fhat`, `profiles`, `fit-tisa`, `compare`" + (", `retrofit`" if f.retrofit else "")
        else:
            does = "`fhat`, `profiles`, `fit-tisa`, `compare` (content-free scores)"
            does = ("`toeplitz` (its table), " if table else "") + does  # MPNet: a table beside its bias
        types = ", ".join(f"`{t}`" for t in f.model_types)
        causal = "yes" if f.causal else ("decoder" if f.encoder_decoder else "no")
        row = [f.name, types, f.mechanism, _layer_kind_words(f), causal, does, _capture_words(f)]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


# -- GGUF files: what transformers' GGUF loader (`load_gguf_checkpoint`) does by architecture name ----------------
# (`checkpoint.gguf_source` reads the config from posprobe's own header and must agree with it; tested equal)
GGUF_LOADER_SPECIAL = ("t5", "qwen2moe", "qwen3moe", "gpt_oss", "gpt-oss", "minimax-m2", "stablelm", "lfm2", "gemma4")
GGUF_TIED_ANYWAY = ("falcon", "bloom")  # marked tied whatever tensors the file holds
GGUF_RENAMED_MODEL_TYPES = {"gemma3": "gemma3_text"}  # a Gemma 3 GGUF holds the text backbone only
GGUF_NAME_RENAMES = (("llama", "mistral"),)  # (architecture, word in general.name): the loader renames the file's type
