"""Key/value sharing across layers (Gemma 3n, Gemma 4): a later layer attends to the keys an earlier layer computed.

The config's `kv_sharing_modes` (a property of its transformers config class; `tensors['kv_sharing']` names it)
marks each layer: 'reuse' layers have no key projection and read the keys and values stored by the last earlier
layer of their own layer type that computes them ('store'), or by the layer a config list names for each layer
(`tensors['kv_sources']`: Kolibri 1.1's kv_source_layers). In the content-free reading (SPEC §9) every layer
gets the embedding-level input, so a reusing layer's keys are its source layer's keys of that input (the source
layer's own input, pre-attention norm, key projection and key norm); its queries are its own.
"""

from __future__ import annotations

from posprobe.errors import PosprobeError


def key_source(ctx, layer: int) -> int:
    """The layer whose keys layer `layer` attends to: `layer` itself, or for a layer that reuses keys and values
    the last earlier layer of its layer type that stores them."""
    name = ctx.family.tensors.get("kv_sharing")
    if not name:
        return layer
    if "key_sources" not in ctx.cache:
        ctx.cache["key_sources"] = _sources(ctx, name)
    return ctx.cache["key_sources"][layer]


def _sources(ctx, name: str) -> list[int]:
    cfg = ctx.transformers_config
    listed = ctx.family.tensors.get("kv_sources")
    if listed:  # each layer's source named in the config (Kolibri 1.1's kv_source_layers; its class validates them)
        return [int(source) for source in getattr(cfg, listed)]
    try:
        modes, types = list(getattr(cfg, name)), list(cfg.layer_types)
    except ValueError as err:  # the config class refuses a sharing its layer types cannot serve
        raise PosprobeError(
            f"the key/value sharing of '{ctx.source.name}' is malformed: {str(err).splitlines()[0][:200]}",
            "check num_kv_shared_layers and layer_types in config.json",
        ) from err
    sources = []
    for layer, mode in enumerate(modes):
        stores = [s for s in range(layer) if modes[s] == "store" and types[s] == types[layer]]
        if mode == "reuse" and not stores:
            raise PosprobeError(
                f"layer {layer} of '{ctx.source.name}' reuses the keys of an earlier '{types[layer]}' layer, but no "
                "earlier layer of that type computes them (num_kv_shared_layers covers them all)",
                "check num_kv_shared_layers and layer_types in config.json",
            )
        sources.append(stores[-1] if mode == "reuse" else layer)
    return sources
