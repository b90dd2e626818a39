"""Retrofit a positional mechanism into a pretrained encoder, through transformers' attention registry.

No modeling code is copied. `retrofit` does four things to a loaded model, in place:

1. registers one attention function, `"posprobe"`, in `transformers.AttentionInterface` (and the stock
   boolean `sdpa_mask` under the same name in `AttentionMaskInterface`) and switches the model to it;
2. attaches the mechanism modules to each self-attention module as `posprobe_mechanisms`
   (an `nn.ModuleList`, one entry per depth at which that module runs), so their weights are ordinary
   parameters saved in the safetensors next to the model's own;
3. adds forward hooks: a pre-hook on every self-attention module that records the current depth slot and
   the key-padding mask, and — only for mechanisms that need them — pre-hooks (CAT) or hooks (conv-qkv)
   on the query/key/value `nn.Linear` projections;
4. records the recipe in `model.config.posprobe` (saved in config.json) so `posprobe.load_model` (models.py)
   can rebuild it.

Depth tracking. BERT, RoBERTa, XLM-R and ELECTRA have one self-attention module per layer, so each module
holds exactly one mechanism and no state is needed. ALBERT shares one layer module across all depths
(`num_hidden_groups` groups of `inner_group_num` layers), so each shared attention module holds one
mechanism per depth at which it runs (TISA then has `3*S*H*L` parameters, as in the paper). A forward
pre-hook on the encoder (`AlbertTransformer`) resets a call counter on each shared module; the module's
own pre-hook takes the next slot. This requires that one encoder forward runs each layer once in order:
gradient checkpointing, which re-runs layers during backward, is refused for ALBERT with several slots.

Dropping position embeddings (TISA "replace", or relative-only models): every row of the learned position
table is set to the average row (RoBERTa-family reserved rows excluded from the average), the table is
frozen, and a pre-hook on the embeddings module passes `position_ids = first row` for every token. The
model then runs on sequences of any length, including longer than `max_position_embeddings`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from posprobe.checkpoint.resolve import TOKENIZER_FILES
from posprobe.errors import ArgumentError, ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.mechanisms.base import ROLES, PositionalMechanism
from posprobe.mechanisms.catalogue import (
    CONFIG_KEY,
    MechanismSettings,
    check_retrofittable,
    check_settings,
    mechanism_info,
)
from posprobe.retrofitting.attention import (
    ATTENTION_NAME,
    RETROFIT_MODEL_TYPES,
    _attention_pre_hook,
    _average_position_table,
    _family,
    _first_real_row,
    _make_constant_position_hook,
    _make_encoder_pre_hook,
    _make_input_hook,
    _make_projection_hook,
    _position_embedding,
    _register_attention,
    depth_slots,
    embeddings_module,
    layer_groups_owner,
    layer_shape,
    projection,
)
from posprobe.validation import as_bool, as_int

_FORMAT_VERSION = 1
INITIAL_FILE = "posprobe_initial.safetensors"  # mechanism parameters as retrofit set them (beside the model)

__all__ = ["ATTENTION_NAME", "RETROFIT_MODEL_TYPES", "depth_slots"]  # re-exported; the rest is defined below


# -- public API ---------------------------------------------------------------------------------------------
def is_retrofitted(model: nn.Module) -> bool:
    """True when mechanisms are installed (a config with a `posprobe` key alone is not enough)."""
    return any(hasattr(m, "posprobe_mechanisms") for m in model.modules())


def added_parameters(model: nn.Module) -> int:
    """Number of parameters the retrofitted mechanism added (0 for a plain model)."""
    seen: set[int] = set()
    total = 0
    for name, param in model.named_parameters(remove_duplicate=True):
        if ".posprobe_mechanisms." in f".{name}" and id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    return total


def _kernels_by_depth(kernels_file, n_depths: int, n_heads: int, shared: bool) -> dict[int, tuple]:
    """Map depth -> (a, b, c) `(H, S)` arrays from a validated `KernelsFile`. Its `layers` say which layers
    were fitted; a single fitted layer of a weight-shared model (ALBERT) initialises every depth; depths that
    were not fitted keep the zero init."""
    a, b, c, layers = kernels_file.a, kernels_file.b, kernels_file.c, kernels_file.layers
    if kernels_file.n_heads != n_heads:
        raise PosprobeError(
            f"kernels file has {kernels_file.n_heads} heads per layer, the model has {n_heads}",
            "fit the kernels on the same model",
        )
    if shared and len(layers) == 1:
        return {d: (a[0], b[0], c[0]) for d in range(n_depths)}
    if any(layer >= n_depths for layer in layers):
        raise PosprobeError(
            f"kernels file has layers {layers}, the model has {n_depths} layers", "fit the kernels on the same model"
        )
    unfitted = [d for d in range(n_depths) if d not in layers]
    if unfitted:
        import warnings

        from posprobe.errors import PosprobeWarning

        warnings.warn(
            f"the kernels file {kernels_file.path} holds layers {layers} only: the TISA kernels of layers "
            f"{unfitted} start at zero (no change); fit every layer to initialise them all",
            PosprobeWarning,
            stacklevel=4,
        )
    return {layer: (a[t], b[t], c[t]) for t, layer in enumerate(layers)}


FIT_PROVENANCE_KEYS = ("model", "model_type", "quantization", "mode", "n_kernels", "window", "fitted_offsets", "layers")


def fit_provenance(kernels_file) -> dict:
    """What made the kernels of an ``init='fit:FILE'`` retrofit (recorded as `init_fit` in `config.posprobe`): the
    file, and from its metadata the model fitted, its quantisation, the mode, S, the window, the fitted offsets
    and layers — so the recipe still says where the start came from when the file is gone."""
    metadata = kernels_file.metadata or {}
    return {"kernels_file": str(kernels_file.path)} | {k: metadata[k] for k in FIT_PROVENANCE_KEYS if k in metadata}


def _install(model: nn.Module, spec: dict) -> list[tuple[nn.Module, int]]:
    """Attach mechanisms and hooks as described by `spec` (no initialisation); returns the depth slots."""
    _family(model)
    if is_retrofitted(model):
        raise PosprobeError("this model is already retrofitted", "start from the original checkpoint")
    try:
        info = mechanism_info(spec["mechanism"])  # a catalogue name or a combination `a+b`
        options = info.options(radius=spec.get("radius"), kernels=spec.get("kernels"))
    except ArgumentError as err:  # a saved recipe (config.json `posprobe`) with a bad value
        raise PosprobeError(
            f"the '{CONFIG_KEY}' recipe in the model's config is invalid ({err.render()})",
            "re-create the checkpoint with `posprobe retrofit`",
        ) from err
    slots = depth_slots(model)
    per_module: dict[int, tuple[nn.Module, int]] = {}
    for module, slot in slots:
        per_module[id(module)] = (module, slot + 1)
    shared = []
    cls = info.load()
    for module, count in per_module.values():
        ref = projection(model, module, "query").weight
        shape = layer_shape(model, module)
        mechs = [cls(shape, options) for _ in range(count)]
        module.posprobe_mechanisms = nn.ModuleList(mechs).to(device=ref.device, dtype=ref.dtype)
        flags = mechs[0]  # combinations decide per instance which hooks they need
        module._posprobe_needs_padding = flags.transforms_inputs or flags.transforms_projections
        module._posprobe_key_valid = None
        module._posprobe_calls = 0
        module._posprobe_slot = 0
        module.register_forward_pre_hook(_attention_pre_hook, with_kwargs=True)
        for role in ROLES:
            if flags.transforms_inputs:
                projection(model, module, role).register_forward_pre_hook(_make_input_hook(module, role))
            if flags.transforms_projections:
                projection(model, module, role).register_forward_hook(_make_projection_hook(module, role))
        if count > 1:
            shared.append(module)
    if shared:
        layer_groups_owner(model).register_forward_pre_hook(_make_encoder_pre_hook(shared))
    if spec.get("drop_position_embeddings"):
        table = _position_embedding(model)
        table.weight.requires_grad_(False)
        hook = _make_constant_position_hook(_first_real_row(model))
        embeddings_module(model).register_forward_pre_hook(hook, with_kwargs=True)
    _register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    return slots


def retrofit(
    model,
    mechanism: str,
    *,
    radius: int | None = None,
    kernels: int | None = None,
    init: str = "zero",
    drop_position_embeddings: bool = False,
    seed: int = 0,
    allow_pickle: bool = False,
) -> nn.Module:
    """Install `mechanism` (a catalogue name, `posprobe.mechanisms.MECHANISM_NAMES`) into every self-attention
    layer of `model` and return the model.

    model: a loaded transformers model (changed in place), or a hub id / local folder / None (the packaged
    MiniLM), built as the class it was saved from (a fine-tuned classifier keeps its head).
    radius: clip radius r (kernel size 2r+1) of the convolution/relative mechanisms (default 8); kernels: TISA's
    S (default 5). init: "zero" (outputs unchanged: zero biases, identity filters), "random" (seeded by `seed`),
    or "fit:PATH" (TISA kernels `(L, H, S)` from `posprobe fit-tisa`; S is the file's — a different `kernels`
    is refused —, the fitted layers come from its metadata; a single layer fitted on ALBERT initialises every
    depth; unfitted depths stay zero). drop_position_embeddings: replace every position embedding by the
    average one (TISA "replace" mode). Every argument is validated before a model is loaded.
    """
    settings = check_settings(mechanism, radius=radius, kernels=kernels, init=init)
    drop_position_embeddings = as_bool(drop_position_embeddings, "drop_position_embeddings")
    seed = as_int(seed, "seed", minimum=0)
    if settings.init.kind == "fit" and settings.kernels_file is None:
        raise ArgumentValueError(
            "init",
            "{arg} 'fit' (kernels fitted to the model's own profiles) needs a kernels file here",
            "write one with `posprobe fit-tisa MODEL` (or posprobe.pipelines.fitting.fit_kernels_file(MODEL, 5, DIR))"
            " and pass init='fit:FILE'; the command line's `retrofit --init fit` does both",
        )
    if not isinstance(model, nn.Module):
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise ArgumentTypeError(
                "model", f"{{arg}} must be a loaded model, a hub id or a folder, got {type(model).__name__}"
            )
        from posprobe.checkpoint import resolve_model
        from posprobe.checkpoint.loading import build_model

        source = resolve_model(None if model is None else str(model), allow_pickle=allow_pickle)
        check_retrofittable(source.config)
        model = build_model(source, saved_model_class(source.config))
    return _retrofit_loaded(model, settings, drop_position_embeddings, seed)


def _retrofit_loaded(model: nn.Module, settings: MechanismSettings, drop_position_embeddings: bool, seed: int):
    from posprobe.checkpoint.loading import check_finite

    _family(model)
    check_finite(model, str(getattr(model.config, "_name_or_path", "") or type(model).__name__))
    if is_retrofitted(model):
        raise PosprobeError("this model is already retrofitted", "start from the original checkpoint")
    spec = {
        "version": _FORMAT_VERSION,
        "mechanism": settings.mechanism,
        "radius": settings.radius,
        "kernels": settings.kernels,
        "drop_position_embeddings": drop_position_embeddings,
        "init": str(settings.init),
        "seed": seed,
    }
    fitted: dict[int, tuple] = {}
    if settings.kernels_file is not None:
        spec["init_fit"] = fit_provenance(settings.kernels_file)
        shared = _family(model).shared_layers or settings.kernels_file.shared_layers
        slots = depth_slots(model)
        fitted = _kernels_by_depth(settings.kernels_file, len(slots), layer_shape(model, slots[0][0]).num_heads, shared)
    slots = _install(model, spec)
    generator = torch.Generator().manual_seed(seed)
    for depth, (module, slot) in enumerate(slots):
        mech = module.posprobe_mechanisms[slot]
        mech.reset("random" if settings.init.kind == "random" else "zero", generator)
        mech.attach(module)
        if depth in fitted:
            mech.load_kernels(*fitted[depth])
    if drop_position_embeddings:
        _average_position_table(model)
    setattr(model.config, CONFIG_KEY, spec)
    model._posprobe_initial = mechanism_state(model)
    return model


def mechanism_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The mechanism parameters of every attention depth, as `{"depth.{d}.{name}": tensor}` (detached copies
    on the CPU; `name` as in the mechanism's `named_parameters`, e.g. `a`, `beta`, `dynamic.w`)."""
    state = {}
    for depth, (module, slot) in enumerate(depth_slots(model)):
        for name, param in module.posprobe_mechanisms[slot].named_parameters():
            state[f"depth.{depth}.{name}"] = param.detach().to("cpu", copy=True).contiguous()
    return state


def initial_state(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The mechanism parameters as `retrofit` initialised them (same keys as `mechanism_state`), carried
    through `save_retrofitted` / `load_model` in `INITIAL_FILE`; None when unknown (older folders)."""
    return getattr(model, "_posprobe_initial", None)


def saved_model_class(config: dict):
    """The transformers class a checkpoint was saved from (config.json `architectures`), so that a task head
    (e.g. a fine-tuned classifier) is kept; None (= AutoModel) when it names no transformers class."""
    import transformers

    names = config.get("architectures") or []
    cls = getattr(transformers, str(names[0]), None) if names and isinstance(names, list) else None
    return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else None


def expected_parameters(model: nn.Module) -> int:
    """The parameters the retrofitted mechanism adds according to the catalogue (SPEC §8): the sum over
    attention depths of `MechanismInfo.parameters_per_depth` (equals `added_parameters`; tested)."""
    spec = getattr(model.config, CONFIG_KEY, None) or {}
    info = mechanism_info(spec["mechanism"])
    options = info.options(radius=spec.get("radius"), kernels=spec.get("kernels"))
    return sum(info.parameters_per_depth(layer_shape(model, module), options) for module, _ in depth_slots(model))


def mechanism_at(model: nn.Module, depth: int) -> PositionalMechanism:
    """The mechanism that runs at attention depth `depth` (0-based, forward order)."""
    module, slot = depth_slots(model)[depth]
    return module.posprobe_mechanisms[slot]


def save_retrofitted(model: nn.Module, out_dir, *, tokenizer_from=None) -> Path:
    """Write the model as a folder `load_model` reads back with its mechanism: config.json (with the
    `posprobe` recipe), model.safetensors (mechanism weights included) and the tokenizer files.

    The folder appears complete or not at all (written into a temporary sibling, then renamed); an existing
    non-empty `out_dir` is refused (nothing is overwritten). tokenizer_from: the folder to copy tokenizer files
    from (default: the folder the model was loaded from, when that is a local folder). Returns the folder.
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "save_pretrained"):
        raise ArgumentTypeError("model", f"{{arg}} must be a transformers model, got {type(model).__name__}")
    from posprobe.validation import as_path

    out = as_path(out_dir, "out_dir")
    if tokenizer_from is None:
        tokenizer_from = getattr(model.config, "_name_or_path", None) or None
    source = as_path(tokenizer_from, "tokenizer_from") if tokenizer_from is not None else None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ArgumentValueError(
            "out_dir",
            f"output '{out}' already exists and is not an empty folder",
            "choose a new {arg} folder (nothing is overwritten)",
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700 folders; give the usual permissions
    except OSError as err:
        raise PosprobeError(
            f"cannot write the folder '{out}' ({err.strerror or err})", "choose a writable output folder"
        ) from err
    try:
        with _quiet_saving():
            model.save_pretrained(tmp)
        initial = initial_state(model)
        if initial:
            from safetensors.torch import save_file

            save_file(initial, str(tmp / INITIAL_FILE), metadata={"posprobe": "initial mechanism parameters"})
        if source is not None and source.is_dir():
            for name in TOKENIZER_FILES:
                if (source / name).is_file():
                    shutil.copy2(source / name, tmp / name)
        if out.exists():
            out.rmdir()  # checked empty above
        os.replace(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        from posprobe.formats.writing import disk_full, disk_full_error

        if disk_full(err):  # also when safetensors wraps the OSError in its own error
            raise disk_full_error(err, out) from err
        if isinstance(err, OSError):
            raise PosprobeError(
                f"cannot write '{out}' ({err.strerror or err})", "check free space and permissions"
            ) from err
        raise
    return out


@contextlib.contextmanager
def _quiet_saving():
    """No "Writing model shards" progress bar from the library (the CLI shows its own status)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
