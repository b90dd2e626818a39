"""How each attention layer attends: globally, in a local window, or block-sparsely (`table.WINDOW_RULES`).

A `LayerKind` per layer, read from the checkpoint's config through its transformers config class (which fills
in defaults and derived fields: layer types, ModernBERT's half window). The content-free scores of a layer are
the same whatever its kind (SPEC §9: the scores the layer gives each pair); its kind says which pairs its
softmax sees: `window` is the largest |k| = |j - i| it attends (causal layers: only k <= 0 of those).
Where layer types also carry their own rotary setting (Gemma 3, ModernBERT), `layer_type` picks it and
`rope` names it. A rotary family's NoPE layers (`Family.nope`: SmolLM3, Cohere 2) apply no rotary embedding:
`nope` marks them (SPEC §9: their content-free scores are the same for every pair). An indexed layer (DeepSeek
Sparse Attention, `families.indexed`) attends the top-k keys its indexer picks for each query: `selected` holds
them, as the indexer picks them on the content-free input. A neighbour-chunk layer (Reformer's local attention)
sees the keys of its query's chunk and of neighbouring chunks, wrapping around, after the model's own padding
(`neighbour_chunk_pairs`).
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass, field, replace

import numpy as np

from posprobe.architectures import table as T
from posprobe.errors import PosprobeError

NOPE_WORDS = "NoPE (no positional term: F̂ is the same for every pair)"
NO_ATTENTION = "none"  # a hybrid's layer without softmax attention (`LayerKind.attention`)
NO_SCORE = "no positional score"
NO_SOFTMAX = "no softmax attention"
LATENT_WORDS = "MLA: F̂ = a position-free constant + the rotary part's score"
POOLED_WORDS = "plus entries pooled over blocks of {} tokens (not positions; not in F̂)"
INDEXED = "indexed"  # `LayerKind.attention` of a layer whose indexer picks each query's top-k keys
INDEXED_LAYER_TYPE = "indexed_attention"  # config.layer_types entry of such a layer (Qwen4-Exp, Kolibri 1.1)
NEIGHBOUR_CHUNKS = "neighbour-chunks"  # `LayerKind.attention` of a layer that attends its chunk and its neighbours


@dataclass(frozen=True)
class LayerKind:
    """One layer's attention: `attention` 'full', 'local' (a window), 'block-sparse', 'indexed' (the top-k keys an
    indexer picks per query) or 'none' (a hybrid's recurrent / state-space / convolution layer: no softmax
    attention, no positional score); `window` the largest |j - i| attended (None: no limit); `layer_type` the
    config's name for it (config.layer_types) where it has one; `rope` the layer's rotary setting in words where
    layer types differ in it; `note` what else to know; `selected` an indexed layer's selection on the content-free
    input (SPEC §9) for the n its kinds were made for, (n, n) bool with each row bit-packed (`np.packbits`), or
    (G, n, n) so packed, one per key-head group (MiniMax M3), each read by `group` consecutive query heads."""

    attention: str = "full"
    window: int | None = None
    layer_type: str | None = None
    rope: str | None = None
    note: str = ""
    nope: bool = False  # no positional mechanism in this layer (NoPE): F̂ is the same for every pair
    chunk: int | None = None  # chunked attention (Llama 4): keys in the query's own chunk of this many positions
    selected: np.ndarray | None = field(default=None, compare=False, repr=False)  # an indexed layer's picks
    group: int = 1  # query heads per selection where `selected` holds one per key-head group
    neighbours: tuple[int, int, int, int, int] | None = None  # neighbour-chunk attention (Reformer's local layers):
    # (chunk, chunks before, chunks after, pad multiple, shortest padded length), `neighbour_chunk_pairs`
    scored_elsewhere: bool = False  # a layer without a positional score that does attend by softmax, over pairs
    # its input's content picks (Reformer's LSH layers): said so, not 'no softmax attention'

    def describe(self) -> str:
        """In words, for JSON and figure titles: 'global', 'local |k| <= 511, rope theta 10000', 'global, NoPE', ..."""
        chunks = (self.neighbours or (0, 0, 0))[:3]  # Reformer's local layers: chunk, chunks before, after
        words = {
            "full": "global",
            "local": f"local |k| <= {self.window}",
            NO_ATTENTION: "softmax attention over content-picked pairs" if self.scored_elsewhere else NO_SOFTMAX,
            "chunked": f"chunks of {self.chunk} tokens",
            NEIGHBOUR_CHUNKS: "local: its chunk of {} and {} before, {} after".format(*chunks),
            INDEXED: "indexed (top-k)",
        }.get(self.attention, self.attention)
        rope = NOPE_WORDS if self.nope else self.rope
        return ", ".join(x for x in (words, rope, self.note) if x)

    def allows(self, k: int) -> bool:
        """True when the layer's window lets a query see the key at offset k (causality is the model's; a chunked
        layer also needs `allowed`: whether k is seen depends on where the query sits in its chunk)."""
        return self.window is None or abs(k) <= self.window

    def allowed(self, n: int) -> np.ndarray:
        """(n, n) bool: the pairs (query i, key j) the layer's window and chunks let attend (causality is the
        model's): |j - i| <= window, and for a chunked layer (Llama 4) i and j in the same chunk of `chunk`;
        (H, n, n), one per query head, where an indexer picks per key-head group."""
        if self.selected is not None:  # an indexed layer: the keys its indexer picked, any offset (rows bit-packed)
            made_for = self.selected.shape[-2]
            if n > made_for:
                raise ValueError(f"this layer's indexer selection was made for {made_for} positions, not {n}")
            picked = np.unpackbits(self.selected[..., :n, :], axis=-1, count=made_for)[..., :n].astype(bool)
            return np.repeat(picked, self.group, axis=0) if picked.ndim == 3 else picked
        if self.neighbours is not None:  # Reformer's local layers: the query's chunk and its neighbours
            return neighbour_chunk_pairs(n, *self.neighbours)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        seen = np.abs(j - i) <= (n if self.window is None else self.window)
        return seen & (i // self.chunk == j // self.chunk) if self.chunk else seen


def layer_kinds(ctx, n: int, stack: str = "encoder") -> list[LayerKind]:
    """The `LayerKind` of every layer of `stack` of the checkpoint `ctx` (a ModelContext) over `n` positions."""
    kinds = _attention_kinds(ctx, n, stack)
    nope = nope_layers(ctx, len(kinds))
    kinds = [replace(kind, nope=True) if layer in nope else kind for layer, kind in enumerate(kinds)]
    thetas = layer_thetas(ctx, len(kinds))
    if len(set(thetas) - {0}) > 1:  # a rope base per layer (Granite SWA): say each rotary layer's
        kinds = [replace(kind, rope=_rope_words({"rope_theta": t})) if t else kind for kind, t in zip(kinds, thetas)]
    if ctx.qkv == T.LATENT and ctx.kind != T.NOPE:  # multi-head latent attention: say the split (families.latent)
        kinds = [replace(kind, note=", ".join(x for x in (kind.note, LATENT_WORDS) if x)) for kind in kinds]
    if "pooled_keys" in ctx.family.tensors:  # DeepSeek V4's compressed layers: pooled entries beside the keys
        from posprobe.families.shared_kv import pooled_rate

        notes = {t: pooled_rate(ctx, t) for t in {kind.layer_type for kind in kinds}}
        kinds = [kind if not notes[kind.layer_type] else replace(kind, note=", ".join(
            x for x in (kind.note, POOLED_WORDS.format(notes[kind.layer_type])) if x)) for kind in kinds]  # fmt: skip
    if "kv_sharing" in ctx.family.tensors:  # Gemma 3n / 4: layers that attend to an earlier layer's keys
        from posprobe.families.kv_sharing import key_source

        for layer, kind in enumerate(kinds):
            source = key_source(ctx, layer)
            if source != layer:
                shared = f"the keys and values of layer {source}"
                kinds[layer] = replace(kind, note=", ".join(x for x in (kind.note, shared) if x))
    if not ctx.family.hybrid:
        return kinds
    types = T.layer_types(ctx.family, ctx.transformers_config)
    softmax = ctx.family.tensors.get("unscored_softmax_layers", "").split(",")  # Reformer's 'lsh'
    return [kind if layer >= len(types) or types[layer] in T.ATTENTION_LAYER_TYPES
            else LayerKind(NO_ATTENTION, layer_type=types[layer],
                           note=f"{ctx.family.hybrid} (layer type '{types[layer]}'): {NO_SCORE}",
                           scored_elsewhere=types[layer] in softmax)
            for layer, kind in enumerate(kinds)]  # fmt: skip


def with_indexed_selections(ctx, kinds: list[LayerKind], words: str, pick) -> list[LayerKind]:
    """`kinds` with each layer whose config.layer_types entry is `INDEXED_LAYER_TYPE` made an indexed layer: `words`
    (what its indexer keeps) in its note, `pick(layer)` ((n, n) bool, the keys each query keeps) its selection."""
    types = T.layer_types(ctx.family, ctx.transformers_config)
    out = []
    for layer, kind in enumerate(kinds):
        if layer >= len(types) or types[layer] != INDEXED_LAYER_TYPE:
            out.append(kind)
            continue
        note = ", ".join(x for x in (words, kind.note) if x)
        out.append(replace(kind, attention=INDEXED, note=note, selected=np.packbits(pick(layer), axis=-1)))
    return out


def attention_layers(ctx, stack: str = "encoder") -> list[int]:
    """The layers of `stack` with softmax attention (every layer but a hybrid's recurrent / convolution ones)."""
    return [layer for layer, kind in enumerate(ctx.layer_kinds(1, stack)) if kind.attention != NO_ATTENTION]


def nope_layers(ctx, count: int) -> set[int]:
    """The layers that apply no rotary embedding (`Family.nope`), read from the config as the model reads it."""
    rule = ctx.family.nope
    if ctx.kind == T.NOPE:  # no layer has a positional term (Jamba)
        return set(range(count))
    if rule is None or ctx.kind != T.ROTARY:
        return set()
    if rule == "zero_rope_theta":  # Granite SWA: a layer whose rope base is 0
        return {layer for layer, theta in enumerate(layer_thetas(ctx, count)) if not theta}
    cfg = ctx.transformers_config
    if rule == "untyped_rope":  # Cohere Compass: a layer type whose rope parameters are null
        types, params = list(cfg.layer_types or [])[:count], cfg.rope_parameters or {}
        return {layer for layer, t in enumerate(types) if params.get(t) is None}
    if rule == "no_rope_layers":  # SmolLM3 / Llama 4: use_rope = no_rope_layers[l]
        flags = list(cfg.no_rope_layers or [])
        return {layer for layer in range(count) if layer < len(flags) and not flags[layer]}
    # global_layers (Cohere 2): only sliding layers rotate, and only when a window is set;
    # global_layers_if_windowed (Exaone 4): the same, but every layer rotates when no window is set
    types = list(getattr(cfg, "layer_types", None) or [None] * count)
    window = getattr(cfg, "sliding_window", None)
    if rule == "global_layers_by_type":  # AFMoE: the layer type alone decides
        return {layer for layer in range(count) if types[layer] != "sliding_attention"}
    forced = set()
    if rule == "global_layers_but_dense_prefix" and getattr(cfg, "prefix_dense_sliding_window_pattern", None) == 1:
        mlp = list(getattr(cfg, "mlp_layer_types", None) or [])  # Cohere 2 MoE's force_rope: dense prefix rotates
        forced = {layer for layer in range(min(count, len(mlp))) if mlp[layer] == "dense"}
    if window is None:
        return set(range(count)) - forced if rule != "global_layers_if_windowed" else set()
    return {layer for layer in range(count) if types[layer] != "sliding_attention"} - forced


def layer_thetas(ctx, count: int) -> list[float]:
    """Each layer's rope base where the family keeps one per layer (config list `Family.tensors['layer_rope_theta']`:
    Granite SWA; 0 is a NoPE layer, `Family.nope` 'zero_rope_theta'), else []."""
    key = ctx.family.tensors.get("layer_rope_theta")
    thetas = list(getattr(ctx.transformers_config, key, None) or []) if key and ctx.kind == T.ROTARY else []
    return [float(t or 0) for t in thetas[:count]]


def _attention_kinds(ctx, n: int, stack: str) -> list[LayerKind]:
    rule, count = ctx.family.windows, ctx.layers(stack)
    if rule == "stack_window":  # stacks run one after another (BLT): each depth's own stack (families.stacked)
        from posprobe.families.stacked import stack_layers

        layers = stack_layers(ctx)  # a stack over other positions (no rope parameters): the hybrid's note below
        ropes = {module: _rope_words(params) for module, _, params in layers if params is not None}
        words = ropes if len(set(ropes.values())) > 1 else {}
        return [LayerKind("local" if reach is not None else "full", reach, module, words.get(module))
                for module, reach, _ in layers]  # fmt: skip
    types = _layer_types(ctx, count)
    ropes = _ropes(ctx, types)
    if rule is None or (rule == "local_radius" and stack == "decoder"):
        return [LayerKind(layer_type=t, rope=ropes.get(t)) for t in types]
    cfg = ctx.transformers_config
    if rule in ("sliding_window", "layer_types", "layer_types_inclusive"):
        window = getattr(cfg, "sliding_window", None)
        reach = None if window is None else window if rule == "layer_types_inclusive" else window - 1

        def local(t):  # |j - i| < w (causal: keys i - w < j <= i); inclusive (ModernBERT): |j - i| <= w
            return window is not None and (rule == "sliding_window" or t in ("sliding_attention", "hybrid_sliding"))

        chunk = getattr(cfg, "attention_chunk_size", None)

        def kind(t):
            if t == "chunked_attention" and chunk:  # Llama 4: keys of the query's own chunk
                return LayerKind("chunked", None, t, ropes.get(t), chunk=int(chunk))
            return (
                LayerKind("local", reach, t, ropes.get(t)) if local(t) else LayerKind(layer_type=t, rope=ropes.get(t))
            )

        return [kind(t) for t in types]
    if rule == "per_layer_config":  # NeoMME: each layer's own window, |j - i| <= w; None: global
        widths = [getattr(c, "sliding_window", None) for c in cfg.per_layer_config[:count]]
        return [LayerKind("local", int(w), t, ropes.get(t)) if w else LayerKind(layer_type=t, rope=ropes.get(t))
                for w, t in zip(widths, types, strict=True)]  # fmt: skip
    if rule == "attention_layers":  # GPT-Neo: local layers see keys i - window_size < j <= i
        return [LayerKind("local", cfg.window_size - 1) if kind == "local" else LayerKind()
                for kind in cfg.attention_layers[:count]]  # fmt: skip
    if rule == "attention_window":  # Longformer: |j - i| <= w / 2 (plus global tokens, none by default)
        windows = cfg.attention_window if isinstance(cfg.attention_window, (list, tuple)) else [cfg.attention_window]
        windows = list(windows) * count if len(windows) == 1 else list(windows)
        return [LayerKind("local", int(w) // 2) for w in windows[:count]]
    if rule == "neighbour_chunks":  # Reformer: 'local' layers attend their chunk and its neighbours ('lsh': hashed)
        neighbours = _neighbour_chunks(cfg)
        neighbour_chunk_count(n, *neighbours)  # refused where a chunk would see a neighbour twice
        return [LayerKind(NEIGHBOUR_CHUNKS, neighbours=neighbours) if kind == "local" else LayerKind()
                for kind in cfg.attn_layers[:count]]  # fmt: skip
    if rule == "block_sparse":
        if getattr(cfg, "attention_type", "block_sparse") != "block_sparse":
            return [LayerKind() for _ in range(count)]
        full_up_to = (5 + 2 * cfg.num_random_blocks) * cfg.block_size
        if n <= full_up_to:  # BigBird switches itself to full attention on such sequences
            return [LayerKind(note=f"full attention up to {full_up_to} positions") for _ in range(count)]
        return [LayerKind("block-sparse", note=f"random blocks of {cfg.block_size} beyond {full_up_to} positions: "
                          "F̂ holds the scores of the pairs it attends") for _ in range(count)]  # fmt: skip
    # local_radius (LongT5's encoder): |j - i| <= local_radius; transient-global adds side keys not in F̂
    tglobal = getattr(cfg, "encoder_attention_type", "local") == "transient-global"
    note = "plus transient-global side keys (block sums, not positions; not in F̂)" if tglobal else ""
    return [LayerKind("local", cfg.local_radius, note=note) for _ in range(count)]


def _neighbour_chunks(cfg) -> tuple[int, int, int, int, int]:
    """`LayerKind.neighbours` of Reformer's local layers from its transformers config: (chunk, chunks before, chunks
    after, the multiple the model pads a sequence to, the longest sequence it does not pad): the multiple is the
    least common multiple of the chunk lengths of the layer types it has, the unpadded length their shortest."""
    lengths = {"local": cfg.local_attn_chunk_length, "lsh": cfg.lsh_attn_chunk_length}
    used = [int(lengths[kind]) for kind in set(cfg.attn_layers)]
    return (int(cfg.local_attn_chunk_length), int(cfg.local_num_chunks_before), int(cfg.local_num_chunks_after),
            math.lcm(*used), min(used))  # fmt: skip


def neighbour_chunk_pairs(n: int, chunk: int, before: int, after: int, multiple: int, shortest: int) -> np.ndarray:
    """(n, n) bool: the pairs (query i, key j) of n positions that a layer attending its own chunk of `chunk`
    positions and `before` / `after` neighbour chunks lets through (Reformer's local attention; causality is the
    model's). The model first pads a sequence longer than `shortest` to a multiple of `multiple` (the padding is
    masked); the chunks wrap around (the chunk before the first is the last one); a padded sequence of at most
    `chunk` positions attends fully. Refused where a chunk would be its own neighbour (fewer chunks than
    before + 1 + after): the model then counts those keys twice in its softmax, which no set of pairs says."""
    count = neighbour_chunk_count(n, chunk, before, after, multiple, shortest)
    if count is None:
        return np.ones((n, n), dtype=bool)
    offsets = [offset % count for offset in range(-before, after + 1)]
    i, j = np.arange(n)[:, None] // chunk, np.arange(n)[None, :] // chunk
    return np.isin((j - i) % count, offsets)


def neighbour_chunk_count(n: int, chunk: int, before: int, after: int, multiple: int, shortest: int) -> int | None:
    """The chunks a neighbour-chunk layer splits n positions into once the model has padded them (see
    `neighbour_chunk_pairs`), or None where it attends fully (at most `chunk` positions after padding); PosprobeError
    where a chunk would see itself or a neighbour twice."""
    padded = n if n <= shortest or n % multiple == 0 else -(-n // multiple) * multiple
    if padded <= chunk:
        return None
    count = padded // chunk
    if before + 1 + after > count:
        raise PosprobeError(
            f"over {n} positions (padded to {padded}: {count} chunks of {chunk}) each local layer's chunk would see "
            f"itself or a neighbour twice (chunks before: {before}, after: {after}), counting those keys twice",
            f"use at most {min(chunk, shortest)} positions or at least {(before + 1 + after) * chunk} (--positions)",
        )
    return count


def _layer_types(ctx, count: int) -> list[str | None]:
    """config.layer_types where the family reads them, else None for every layer."""
    if not (ctx.family.windows or "").startswith("layer_types") and not takes_layer_type(ctx):
        return [None] * count
    types = getattr(ctx.transformers_config, "layer_types", None)
    if types and "loop" in ctx.family.tensors:  # Inkling 2 Loop: each depth its stored layer's type
        return [types[ctx.stored_layer(layer)] for layer in range(count)]
    return list(types[:count]) if types else [None] * count


def _ropes(ctx, types: list[str | None]) -> dict:
    """layer type -> its rotary setting in words, where the family's rotary module has one per layer type and
    they differ; else {}."""
    if not takes_layer_type(ctx) or None in types:
        return {}
    params = ctx.transformers_config.rope_parameters
    settings = {t: params.get(rope_setting(ctx, t)) for t in set(types)}
    words = {t: _rope_words(p) for t, p in settings.items() if p is not None}  # null: a NoPE type
    return words if len(set(words.values())) > 1 else {}


def rope_setting(ctx, layer_type: str | None) -> str | None:
    """The key of the rotary module's settings that a layer of `layer_type` reads: the layer type itself, or where
    the family keys its rope parameters otherwise (`Family.tensors['rope_types']`, 'type:key,...' with '*' for any
    other type: DeepSeek V4's 'main' for sliding layers, 'compress' for the others) the key it names."""
    rule = ctx.family.tensors.get("rope_types")
    if not rule or layer_type is None:
        return layer_type
    keys = dict(pair.split(":") for pair in rule.split(","))
    return keys.get(layer_type, keys.get("*", layer_type))


def _rope_words(params: dict) -> str:
    theta = params.get("rope_theta")
    theta = f"{theta:.0f}" if theta is not None and float(theta).is_integer() else f"{theta}"
    kind = params.get("rope_type", "default")
    return ("" if kind == "default" else f"{kind} ") + f"rope theta {theta}"


# the rotary modules whose forward takes a layer type (one rotary setting per type), read from their signatures
# once and kept here, so that deciding it imports nothing (the modeling module cost seconds per command, issue 49);
# tests/test_family_table.py checks the list against every family's module
ROTARY_PER_LAYER_TYPE = frozenset({
    "posprobe.families.stacked:StackRotary",
    "transformers.models.beam.modeling_beam:BeamRotaryEmbedding",
    "transformers.models.cohere_compass.modeling_cohere_compass:CohereCompassRotaryEmbedding",
    "transformers.models.deepseek_v4.modeling_deepseek_v4:DeepseekV4RotaryEmbedding",
    "transformers.models.dory.modeling_dory:DoryRotaryEmbedding",
    "transformers.models.dots3_note.modeling_dots3_note:Dots3NoteTextRotaryEmbedding",
    "transformers.models.ergo.modeling_ergo:ErgoRotaryEmbedding",
    "transformers.models.gemma3.modeling_gemma3:Gemma3RotaryEmbedding",
    "transformers.models.gemma3n.modeling_gemma3n:Gemma3nRotaryEmbedding",
    "transformers.models.gemma4.modeling_gemma4:Gemma4TextRotaryEmbedding",
    "transformers.models.gemma4_unified.modeling_gemma4_unified:Gemma4UnifiedTextRotaryEmbedding",
    "transformers.models.laguna.modeling_laguna:LagunaRotaryEmbedding",
    "transformers.models.lfm3.modeling_lfm3:Lfm3RotaryEmbedding",
    "transformers.models.mellum.modeling_mellum:MellumRotaryEmbedding",
    "transformers.models.mimo_v2_flash.modeling_mimo_v2_flash:MiMoV2FlashRotaryEmbedding",
    "transformers.models.modernbert.modeling_modernbert:ModernBertRotaryEmbedding",
    "transformers.models.modernbert_decoder.modeling_modernbert_decoder:ModernBertDecoderRotaryEmbedding",
    "transformers.models.neomme.modeling_neomme:NeoMMERotaryEmbedding",
    "transformers.models.olmo3.modeling_olmo3:Olmo3RotaryEmbedding",
    "transformers.models.ultrabert.modeling_ultrabert:UltrabertRotaryEmbedding",
    "transformers.models.zaya.modeling_zaya:ZayaRotaryEmbedding",
})  # fmt: skip


def takes_layer_type(ctx) -> bool:
    """True when the family's rotary module takes a layer type (one rotary setting per type: Gemma 3, ModernBERT):
    `ROTARY_PER_LAYER_TYPE`, no import."""
    return ctx.kind == T.ROTARY and ctx.family.rotary_class in ROTARY_PER_LAYER_TYPE


def module_takes_layer_type(rotary_class: str) -> bool:
    """Whether the rotary module 'module:Class' takes a layer type, read from its forward's signature (imports the
    module: for the test that keeps `ROTARY_PER_LAYER_TYPE` true)."""
    module, name = rotary_class.split(":")
    forward = getattr(getattr(importlib.import_module(module), name), "forward", None)
    return forward is not None and "layer_type" in inspect.signature(forward).parameters
