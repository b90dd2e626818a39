"""`posprobe rotary` (SPEC §15): per layer and head, how much of the query and key norm lives in each rotary frequency
band, with each band's frequency and wavelength as the family's own rotary module gives them (rope_scaling
included). Content-free without texts (the constant input of SPEC §9: the average word embedding at the
embedding level); with texts, the band norms of every real token's query and key (its hidden state through the
model reader's norm, projections, biases and q/k norms), averaged over the tokens in one streamed pass.

The result type is in `rotary_result.py`; the pure computations in `posprobe.analysis.rotary_bands`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from os import PathLike
from typing import Any

import numpy as np

from posprobe.analysis.context_loss import rotary_budget
from posprobe.analysis.rotary_bands import BandNormAccumulator, band_norms, band_pairs, frequencies_from_angles
from posprobe.analysis.rotary_bands import unrotated_norm as unrotated
from posprobe.architectures import table as T
from posprobe.checkpoint import ModelSource
from posprobe.errors import PosprobeError
from posprobe.families.context import require_hidden_layer_inputs
from posprobe.families.rope_variants import parse_variants
from posprobe.pipelines.data_conditioned import capture_target, run_on_texts, text_settings
from posprobe.pipelines.defaults import ROPE_SCALING
from posprobe.pipelines.rotary_result import RotaryBandsResult
from posprobe.pipelines.score_reader import ScoreReader, _layer_index, open_model
from posprobe.validation import as_int_list


def rotary(
    model: str | PathLike | Any | None = None,
    layers: list[int] | str | None = None,
    *,
    positions: int | None = None,
    texts: Iterable[str] | None = None,
    input_ids: Iterable[list[int]] | None = None,
    special_ids: Iterable[int] | None = None,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = 32,
    device: str | None = None,
    progress: Callable[[int], None] | None = None,
    allow_pickle: bool = False,
    source: ModelSource | None = None,
    rope_scaling: str | Sequence[str] = ROPE_SCALING,
    max_memory: dict | str | None = None,
    edits: Any = None,
) -> RotaryBandsResult:
    """Rotary band norms of every head of `layers` (SPEC §15): `q_band_norm` (L_sel, H, r/2), `k_band_norm`
    (L_sel, H_kv, r/2), each band's `frequencies` and `wavelengths` (L_sel, r/2).

    model: hub id, folder, None or a loaded transformers model of a rotary family. layers: a list of layer indices
    (-1 = last), or None / 'all'. positions: the sequence length n the rotary module's angles are computed for
    (default min(the model's maximum, 512); frequencies depend on it only for dynamic / longrope scaling beyond
    the original context). Without texts the bands of the content-free input (the average word embedding, SPEC
    §9); with `texts` (strings, tokenised with the model's tokenizer) or `input_ids` (token id sequences), the
    mean over real tokens of each token's band norms; max_length, max_texts, batch_size, device, progress,
    max_memory as for `attention_profiles`. rope_scaling: the variants of the budget (SPEC §17), e.g.
    'none,yarn:4'. Each layer's bands are read against the context it sees: its sliding window where it has one,
    else the model's. edits (with texts): SPEC §20's edits applied in every pass over the texts (recorded in
    `texts['edits']`).
    """
    variants = parse_variants(rope_scaling)
    if not (isinstance(layers, str) and layers == "all"):
        layers = as_int_list(layers, "layers")
    settings = text_settings(texts, input_ids, special_ids, max_length=max_length, max_texts=max_texts,
                             batch_size=batch_size, device=device, progress=progress,
                             max_memory=max_memory, edits=edits)  # fmt: skip
    ctx = open_model(model, allow_pickle, source)
    _require_rotary(ctx)
    reader = ScoreReader(ctx, positions)
    n_layers, name = reader.n_layers, ctx.source.name
    if layers is None or layers == "all":
        layers = list(range(n_layers))
    else:
        layers = list(dict.fromkeys(_layer_index(x, n_layers, name, "layers") for x in layers))
    from posprobe.families.kv_sharing import key_source
    from posprobe.families.rotary import layer_rotary, pairing, rotary_angles

    n = max(reader.n, 2)
    # one rotary setting per layer type (Gemma 3, ModernBERT: local / global) or per layer (Granite SWA's bases)
    # a hybrid's layer without attention has no rotary setting of its own: the first attention layer's (its bands
    # are NaN; LFM3's convolutions, BLT's patch stack)
    kinds = ctx.layer_kinds(n)
    first = next((layer for layer, kind in enumerate(kinds) if kind.attention != "none"), 0)
    types = [layer_rotary(ctx, layer if kinds[layer].attention != "none" else first, n) for layer in layers]
    windows = [ctx.layer_kinds(n)[layer].window for layer in layers]  # the largest |j - i| a layer attends
    angles = {t: rotary_angles(ctx, n, *t) for t in dict.fromkeys(types)}
    cos, sin = angles[types[0]]
    shapes = {ctx.layer_shape(ctx.stored_layer(layer)) for layer in layers}  # Gemma 4: a head size per layer type
    if len(shapes) > 1:
        sizes = sorted({(x.heads, x.head_dim, x.kv_heads) for x in shapes})  # Laguna: a query-head count per layer
        raise PosprobeError(
            f"the layers asked for of '{name}' have heads of several shapes (query heads, head size, key heads) "
            f"{sizes}: rotary bands take layers of one head shape",
            "pass --layers of one layer type (layers=)",
        )
    s = shapes.pop()
    rotated = cos.shape[-1]
    widths = sorted({a[0].shape[-1] for a in angles.values()})
    if len(widths) > 1:  # one rotated width per layer type (MiMo-V2-Flash's partial rotary factors)
        raise PosprobeError(
            f"the selected layers of '{name}' rotate different numbers of dims ({', '.join(map(str, widths))})",
            "pass --layers of one layer type (their kinds: `posprobe fhat`)",
        )
    if rotated > s.head_dim or rotated % 2 or rotated < 2:
        raise PosprobeError(
            f"the rotary module of '{name}' rotates {rotated} dims of {s.head_dim}-dim heads",
            "the config is malformed; re-save the checkpoint",
        )
    order = pairing(T.rotary_layout(ctx.family, ctx.config), s.head_dim, rotated)
    pairs = band_pairs(rotated, order)
    half = f"rotate_half: dims (f, f + {rotated // 2})"
    words = half if order is None else f"{T.rotary_layout(ctx.family, ctx.config)}: dims (2f, 2f + 1)"
    per_type = {t: frequencies_from_angles(*a) for t, a in angles.items()}
    theta = np.stack([per_type[t][0] for t in types])  # (L_sel, F)
    scale = per_type[types[0]][1]
    texts_record = None
    if settings is None:
        parts = []
        for layer in layers:
            if ctx.layer_kinds(n)[layer].attention == "none":  # a hybrid's recurrent / convolution layer: no bands
                q, k = np.full((s.heads, s.head_dim), np.nan), np.full((s.kv_heads, s.head_dim), np.nan)
            else:
                q, k = ctx.query_key(layer)  # (H, d_h), (H_kv, d_h)
            parts.append((band_norms(q, pairs), band_norms(k, pairs), unrotated(q, pairs), unrotated(k, pairs)))
        q_norm, k_norm, q_rest, k_rest = (np.stack(part) for part in zip(*parts))
    else:
        require_hidden_layer_inputs(ctx)
        sources = {layer: key_source(ctx, layer) for layer in layers}  # Gemma 4: layers reusing earlier keys
        make = lambda length, device: [BandNormAccumulator(layers, ctx.query_key_of, pairs, sources)]  # noqa: E731
        (accumulator,), summary, length = run_on_texts(capture_target(model, source), make, settings, allow_pickle)
        q_norm, k_norm, q_rest, k_rest, tokens = accumulator.result()
        texts_record = {"text": None, "n_texts": summary.n_texts, "n_tokens": tokens, "max_length": length,
                        "longest_text": summary.longest, "edits": [e.text for e in settings.edits]}  # fmt: skip
    return RotaryBandsResult(
        model=name,
        model_type=ctx.source.model_type,
        layers=layers,
        n_layers=n_layers,
        head_dim=s.head_dim,
        rotated_dims=rotated,
        pairing=words,
        frequencies=theta,
        rotary_scale=scale,
        q_band_norm=q_norm,
        k_band_norm=k_norm,
        q_unrotated_norm=q_rest,
        k_unrotated_norm=k_rest,
        n_positions=n,
        max_positions=ctx.max_positions,
        texts=texts_record,
        quantization=ctx.source.quantization,
        layer_windows=[None if w is None else int(w) + 1 for w in windows],
        budget=budget_of(ctx, variants, types[0][0] if len({t[0] for t in types}) == 1 else None),
        layer_kinds=[ctx.layer_kinds(n)[layer].describe() for layer in layers],
        latent_split=(
            f"multi-head latent attention: the bands are each head's rotary part ({rotated} dims); its other "
            f"{s.head_dim - rotated} dims are the position-free part (q/k_unrotated_norm)"
            if ctx.qkv == T.LATENT
            else ""
        ),
    )


def rotary_layer_groups(ctx, n: int = 2) -> list[list[int]]:
    """The model's layers in groups that rotary bands read together: one head shape (query heads, head size, key
    heads) and one rotated width each (Laguna: a query-head count per layer; MiMo-V2-Flash: a partial rotary factor
    per layer type), in the order of each group's first layer; one group for most models."""
    from posprobe.families.rotary import layer_rotary, rotary_angles

    groups: dict[tuple, list[int]] = {}
    widths: dict[tuple, int] = {}
    for layer in range(ScoreReader(ctx, n).n_layers):
        setting = layer_rotary(ctx, layer, n)
        if setting not in widths:
            widths[setting] = rotary_angles(ctx, n, *setting)[0].shape[-1]
        groups.setdefault((ctx.layer_shape(ctx.stored_layer(layer)), widths[setting]), []).append(layer)
    return list(groups.values())


def budget_of(ctx, variants: list, layer_type: str | None = None) -> dict | None:
    """The rotary budget (SPEC §17) of a rotary model from its config alone (`ctx`: anything with `.config`,
    `.source` and `.family`): the base of its rope parameters (the full-attention setting of a model with one per
    layer type, or the setting of `layer_type` where given and the config has one for it: the layers read are all
    of that type, Laguna's sliding layers), the trained length, and each variant's inverse frequencies as the
    family's own rotary module builds them (a variant changes the full-attention setting only, so another type's
    are its own in every variant); `layer_type` in the result names the setting read, where the config has one per
    type. None for a family whose rotary module is not built from rope parameters (GPT-J's rotary_dim, RoFormer's
    table)."""
    from posprobe.families import rope_variants as R
    from posprobe.families.rotary import transformers_config

    f = ctx.family
    if not f.rotary_class or f.rotary_layout == T.SIN_COS_TABLE:
        return None
    plain = _plain_budget(ctx, variants)
    if plain is not None:
        return plain
    config = transformers_config(ctx)
    if not getattr(config, "rope_parameters", None):  # GPT-J, CodeGen: a rotary_dim and no rope parameters
        return None
    module_name, class_name = f.rotary_class.split(":")
    rotary_class = getattr(importlib.import_module(module_name), class_name)
    try:
        base, key = R.base_parameters(config), R.variant_key(config)
        if key is not None and layer_type in config.rope_parameters:  # the layers read are all of one type
            base, key = config.rope_parameters[layer_type], layer_type
        theta = float(base["rope_theta"])
        freqs = {}
        for variant in variants:
            module = rotary_class(config=R.variant_config(config, variant))
            freqs[variant.name] = R.inv_freq_of(module, key)[0].double().numpy()
    except (KeyError, TypeError, AttributeError, ValueError):  # a rotary module that takes no rope parameters
        return None
    if any((np.asarray(freq) == 0).any() for freq in freqs.values()):  # Gemma 4's proportional rope: pairs that
        return None  # never rotate, where the budget's formula has every pair rotate
    trained = R.trained_length(config)
    if trained is None:
        return None
    budget = rotary_budget(2 * len(next(iter(freqs.values()))), theta, trained, freqs)
    return budget if key is None else budget | {"layer_type": key}


def _plain_budget(ctx, variants: list) -> dict | None:
    """`budget_of` without torch or transformers (issue 49) for the original RoPE of a Llama-like module asked for
    variant 'none' only: the inverse frequencies of `default_rope_inv_freq` (the module's, bit for bit), the
    trained length from config.json (`original_max_position_embeddings` where set, else
    `max_position_embeddings`); None where the rotary module must be built."""
    from posprobe.families.rope_variants import NONE
    from posprobe.families.rotary import default_rope_inv_freq

    if [v.name for v in variants] != [NONE]:
        return None
    found = default_rope_inv_freq(ctx)
    config = ctx.config
    params = config.get("rope_parameters") or {}
    trained = config.get("original_max_position_embeddings", params.get("original_max_position_embeddings"))
    if not (isinstance(trained, int) and trained > 0):
        trained = config.get("max_position_embeddings")
    if found is None or not (isinstance(trained, int) and not isinstance(trained, bool) and trained > 0):
        return None
    base, inv_freq = found
    return rotary_budget(2 * len(inv_freq), base, trained, {NONE: inv_freq.astype(np.float64)})


def _require_rotary(ctx) -> None:
    """Refuse a model whose positions are not rotary, saying what it has and which commands show it."""
    if ctx.kind == T.ROTARY:
        return
    source = ctx.source
    where = "`posprobe toeplitz` (its table), " if ctx.has_table else ""
    raise PosprobeError(
        f"'{source.name}' ({source.model_type}) uses {T.KIND_NAMES.get(ctx.kind, ctx.kind)}, not rotary embeddings: "
        "it has no rotary frequency bands",
        f"its positional structure is shown by {where}`posprobe profiles` and `posprobe fhat`",
    )


CONFIG_ONLY_NOTE = "config only: band norms need the weights; the budget needs only the config"


def config_budget(source: ModelSource, rope_scaling: str | Sequence[str] = ROPE_SCALING) -> dict:
    """The rotary budget (SPEC §17) of a checkpoint read from its config alone (a folder with a config.json and no
    weights): {model, model_type, mode 'config-only', budget, note}. Refused in one line for a family without
    rotary embeddings."""
    from types import SimpleNamespace

    from posprobe.families.context import check_analysable
    from posprobe.families.language_model import language_model_view

    variants = parse_variants(rope_scaling)
    family = check_analysable(source)
    source = language_model_view(source, None)[0]  # a multimodal wrapper: its language model's config
    kind, mechanism = T.position_kind(source.config)
    if kind != T.ROTARY:
        raise PosprobeError(
            f"'{source.name}' ({source.model_type}) uses {mechanism}, not rotary embeddings: it has no rotary budget",
            "pass a rotary model (Llama, Qwen, Gemma, SmolLM2, ...)",
        )
    budget = budget_of(SimpleNamespace(config=source.config, source=source, family=family), variants)
    if budget is None:
        raise PosprobeError(
            f"the rotary module of '{source.name}' ({source.model_type}) is not built from rope parameters, so "
            "posprobe has no budget for it from the config alone",
            "pass the checkpoint with its weights: `posprobe rotary` then reports its bands",
        )
    return {"model": source.name, "model_type": source.model_type, "mode": "config-only", "budget": budget,
            "note": CONFIG_ONLY_NOTE}  # fmt: skip
