"""The model side of a capture: load a model and its tokenizer, check that it can be captured, and the settings
that depend on it (device, the longest input its positions allow, the id to pad with)."""

from __future__ import annotations

from typing import Any

from posprobe.errors import ArgumentValueError, PosprobeError

DEFAULT_MAX_LENGTH = 128


def text_config(model):
    """The config of the model's text stack (the model's own config for plain language models)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def reads_padding(model) -> bool:
    """True when the model's family gives real tokens outputs that depend on the padding beside them
    (`Family.reads_padding`: ConvBERT's span convolutions, CPM-Ant's mask): its texts run one at a time, unpadded."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(text_config(model), "model_type", "")))
    return family is not None and family.reads_padding


def check_model(model, attention: bool = True, encoder_decoder: bool = False, hybrid: bool = False) -> tuple[int, int]:
    """(layers, heads) of the stack a capture runs (heads: the most of any layer where the config gives a query-head
    count per layer, Laguna, Dots3; a layer's missing heads are NaN in the capture); PosprobeError for a model that
    cannot be captured: with `attention` (scores or probabilities are recorded), a retrofitted model (its attention is a
    posprobe mechanism), a model without softmax attention, and a hybrid (softmax attention in some layers only) unless
    `hybrid` (the capture and `posprobe attention` record its attention layers, `attention_layers`; callers that read
    every layer's attention keep the refusal); an encoder-decoder unless `encoder_decoder` (then its encoder stack runs,
    or its decoder where the encoder reads no text, `Family.text_stack`, `stack_to_run`: the capture and `posprobe
    attention` pass it; callers that measure one stack of a model with one keep the refusal).
    Families whose attention goes through transformers' AttentionInterface are recorded there
    (`capture.recording`), the others on their eager path (`capture.eager`); whether a family's attention really
    is reproduced is checked on the first batch, and input lengths by `check_length`."""
    from posprobe.retrofitting.install import is_retrofitted

    kind = getattr(model.config, "model_type", "unknown")
    if attention and is_retrofitted(model):
        raise PosprobeError(
            "this model is retrofitted with a posprobe mechanism, whose attention this command does not record",
            "measure the original checkpoint",
        )
    if not encoder_decoder and getattr(model.config, "is_encoder_decoder", False):
        raise PosprobeError(
            f"'{kind}' is an encoder-decoder model; only encoders and decoders are supported",
            "pass an encoder (BERT-like) or a decoder (GPT-like) model",
        )
    from posprobe.families import family_for_type

    family = family_for_type(str(kind))
    if attention and family is not None and not family.softmax_attention:
        raise PosprobeError(
            f"'{kind}' has {family.mechanism}, so there is no attention to record",
            "`posprobe states` reads its hidden states (every layer)",
        )
    if family is not None and family.draft_of:
        raise PosprobeError(f"'{kind}' is {family.mechanism}", f"run texts through {family.draft_of}")
    if family is not None and "codebook_words" in family.tensors:  # MusicGen
        raise PosprobeError(
            f"'{kind}' reads one token of each codebook at every position (audio codes), not one token sequence, so "
            "texts cannot be run through it",
            "its content-free scores: `posprobe fhat` / `profiles` on the checkpoint",
        )
    if not attention and family is not None and family.stacks:  # hidden states alone (BLT: none per layer)
        check_hidden_states(model)
    if attention and family is not None and family.hybrid and not hybrid:
        raise PosprobeError(
            f"'{kind}' is a hybrid: softmax attention in some layers, {family.hybrid} in the others; this command "
            "records models whose every layer attends",
            "use `posprobe attention` / `profiles` / `rotary` for its attention layers, `posprobe states` for every "
            "layer",
        )
    cfg = text_config(model)
    prompt = family.tensors.get("prompt_tokens") if family is not None else None
    if attention and prompt and getattr(cfg, prompt, 0):  # CPM-Ant's prompt tokens
        raise PosprobeError(
            f"'{kind}' runs {getattr(cfg, prompt)} prompt tokens of its own before every text ({prompt}), so its "
            "attention is not one softmax over the text's keys",
            "its content-free scores (`posprobe fhat`, `profiles`) read the text's pairs",
        )
    counts = _query_heads_per_layer(family, cfg)  # Laguna, Dots3: H the most of any layer, the others NaN (SPEC §9)
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = max(counts) if counts else getattr(cfg, "num_attention_heads", None)
    if family is not None and family.sizes:  # the stack it reads has sizes of its own (Whisper's decoder)
        from posprobe.architectures.table import config_value, stack_sizes

        sizes = stack_sizes(family, cfg.to_dict())
        layers, heads = config_value(sizes, "layers"), config_value(sizes, "heads")
    if family is not None and "loop" in family.tensors:  # a block of layers run several times: a call per depth
        from posprobe.architectures.config import config_shape

        layers = config_shape(cfg.to_dict(), kind, family).layers
    if family is not None and "pooled_blocks" in family.tensors:  # Funnel: every layer run, its decoder's too
        from posprobe.capture.pooled import pooled_layers

        first, later, decoder = pooled_layers(model)
        layers = first + sum(later) + decoder
    if not layers or not heads:
        raise PosprobeError(f"cannot read the number of layers and heads of '{kind}'", "use a standard config")
    if family is not None and family.head_ratio:  # mixed attention (ConvBERT): its softmax heads
        from posprobe.architectures.table import softmax_heads

        heads = softmax_heads(family, cfg.to_dict(), int(heads))
    return int(layers), int(heads)


def _query_heads_per_layer(family, cfg) -> list[int] | None:
    """Each layer's query-head count where the family's layers have their own: a config list
    (`Family.tensors['query_heads_per_layer']`: Laguna), or MLA sizes per layer from transformers' per_layer_config
    (`Family.tensors['latent_sizes']`: Dots3, where transformers refuses config.num_attention_heads when the counts
    differ); else None."""
    if family is None:
        return None
    per_layer = family.tensors.get("query_heads_per_layer")
    if per_layer and getattr(cfg, per_layer, None):
        return [int(count) for count in getattr(cfg, per_layer)]
    if family.tensors.get("latent_sizes") != "per_layer_config":
        return None
    return [int(cfg.per_layer_config[layer].num_attention_heads) for layer in range(cfg.num_hidden_layers)]


def attention_layers(model, n_layers: int | None = None) -> list[int]:
    """The layers of the stack a capture runs that have softmax attention, in depth order: every layer, or a
    hybrid's (`Family.hybrid`: Jamba, LFM2, Qwen3-Next, ...) attention layers, those whose config.layer_types entry
    is one of `table.ATTENTION_LAYER_TYPES` (its other layers, recurrent / state-space / convolution, call no
    attention). `n_layers`: the stack's layer count where the caller has read it (`check_model`). PosprobeError for
    a hybrid whose config names no layer types."""
    from posprobe.architectures.table import ATTENTION_LAYER_TYPES, layer_types
    from posprobe.families import family_for_type

    net = stack_to_run(model)
    cfg = text_config(net)
    layers = int(n_layers if n_layers is not None else getattr(cfg, "num_hidden_layers", 0) or 0)
    kind = str(getattr(net.config, "model_type", "unknown"))
    family = family_for_type(kind)
    if family is not None and "pooled_blocks" in family.tensors:  # Funnel: its first block, at the text's positions
        from posprobe.capture.pooled import pooled_layers

        return list(range(pooled_layers(net)[0]))
    if family is None or not family.hybrid:
        return list(range(layers))
    types = layer_types(family, cfg)
    if len(types) < layers:
        raise PosprobeError(
            f"the hybrid '{kind}' names the kind of {len(types)} of its {layers} layers (config.layer_types), so "
            "its attention layers are unknown",
            "use a config that sets layer_types (or its family's layer pattern) for every layer",
        )
    return [layer for layer in range(layers) if types[layer] in ATTENTION_LAYER_TYPES]


def picks_keys_per_head(model) -> bool:
    """True where the model's layers may give each key-head group keys of its own (a block indexer per group:
    `Family.indexer` with `Family.tensors['indexed_layer_type']`, MiniMax M3): the capture then hands over allowed
    pairs per head in those layers (`recording.group_selected`), and reducers keep their counts per head."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(text_config(model), "model_type", "")))
    return family is not None and bool(family.indexer) and "indexed_layer_type" in family.tensors


def run_stack(model) -> str | None:
    """The stack of an encoder-decoder that `stack_to_run` gives ('encoder', or 'decoder' where the family's
    encoder reads no text: `Family.text_stack`); None for a model of one stack."""
    if not getattr(model.config, "is_encoder_decoder", False):
        return None
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(model.config, "model_type", "")))
    return "encoder" if family is None else family.text_stack


def check_hidden_states(model) -> None:
    """Refuse the hidden states of a model that skips layers on text (`Family.hybrid_layers` that its config lists:
    Mllama's cross-attention layers run only with an image): transformers returns none entering them, so
    hidden_states[l] would not be layer l's input past the first of them; and of a model whose stacks run one after
    another over other positions (`Family.stacks`, BLT's bytes and patches)."""
    from posprobe.architectures.table import CROSS_ATTENTION, layer_types
    from posprobe.families import family_for_type

    kind = str(getattr(model.config, "model_type", "unknown"))
    family = family_for_type(kind)
    if family is not None and family.stacks:  # BLT: byte stacks around a stack over patches
        raise PosprobeError(
            f"'{kind}' runs a text through stacks over its bytes and over patches of them (its global layers have no "
            "state per byte, and its byte decoder's first input adds cross-attention to the patches), so it has no one "
            "hidden state per layer over the text's positions",
            "its attention on text (`posprobe attention`) and its content-free scores (`posprobe fhat`) are read",
        )
    if family is None or not family.hybrid_layers:
        return
    skipped = [layer for layer, t in enumerate(layer_types(family, text_config(model))) if t == CROSS_ATTENTION]
    if skipped:
        raise PosprobeError(
            f"'{kind}' skips its layers {skipped} on text ({family.hybrid}), so transformers returns no hidden state "
            "entering them and hidden state l is not layer l's input",
            "its attention is read (`posprobe attention`, `fhat`, `profiles`), its hidden states are not",
        )


def stack_to_run(model):
    """The module a capture runs on text: the model itself (a wrapper transformers cannot run on text: its language
    model, `language_model_alone`), or the encoder stack of an encoder-decoder (its
    decoder's self-attention needs decoder inputs, a target text, and reads the encoder's output as well); the
    decoder stack, run without encoder states, where the encoder reads no text (`Family.text_stack`: Whisper)."""
    stack = run_stack(model)
    if stack is None:
        return language_model_alone(model)
    getter = "get_decoder" if stack == "decoder" else "get_encoder"
    found = getattr(model, getter)() if hasattr(model, getter) else None
    if found is None or found is model:
        raise PosprobeError(
            f"cannot find the {stack} stack of the encoder-decoder '{getattr(model.config, 'model_type', '?')}'",
            f"pass a model with {getter}(), or its encoder or decoder alone",
        )
    return found


def language_model_alone(model):
    """A loaded multimodal wrapper that transformers cannot run on text (`Family.language_model_alone`: Llama 4's
    forward fails after its language model ran): its language model module, which the wrapper runs on text; any
    other model as it is."""
    from posprobe.families import family_for_type

    family = family_for_type(str(getattr(model.config, "model_type", "")))
    if family is None or not family.language_model_alone:
        return model
    module = family.language_model[1]
    found = [m for name, m in model.named_modules() if f".{name}".endswith(f".{module}")]
    return found[0] if found else model


def block_sparse_limit(model) -> int | None:
    """The longest input a block-sparse BigBird still attends fully ((5 + 2 random blocks) x block size; it
    switches itself to full attention there and attends random blocks beyond), or None for other models."""
    cfg = text_config(model)
    if getattr(cfg, "attention_type", None) != "block_sparse" or not hasattr(cfg, "num_random_blocks"):
        return None
    return (5 + 2 * int(cfg.num_random_blocks)) * int(cfg.block_size)


def check_length(model, longest: int) -> None:
    """Refuse inputs of `longest` tokens that the model attends in a way no (queries x keys) matrix holds."""
    limit = block_sparse_limit(model)
    if limit is not None and longest > limit:
        raise PosprobeError(
            f"'{getattr(model.config, 'model_type', 'unknown')}' attends block-sparsely (random blocks) beyond "
            f"{limit} tokens, where no (queries x keys) attention matrix exists; inputs may be {longest} long",
            f"use --max-length {limit} or less",
        )


def max_positions(model) -> int | None:
    """Longest input the model's positions allow (RoBERTa family: table minus its reserved rows)."""
    from posprobe.architectures.table import config_value, stack_sizes
    from posprobe.families import family_for_type

    cfg = text_config(model)
    n = getattr(cfg, "max_position_embeddings", None)
    family = family_for_type(str(getattr(cfg, "model_type", "")))
    if family is not None and "positions" in family.sizes:  # the read stack's own limit (Whisper's decoder)
        n = config_value(stack_sizes(family, cfg.to_dict()), "positions")
    if n is None:
        return None
    from posprobe.architectures.config import reserved_rows

    return int(n) - reserved_rows(cfg.to_dict(), str(getattr(cfg, "_name_or_path", "") or "the model"))


def resolve_max_length(model, max_length: int | None) -> int:
    """`max_length` (tokens per text), default 128 or the model's positions if fewer; refused beyond them."""
    limit = max_positions(model)
    if max_length is None:
        return min(DEFAULT_MAX_LENGTH, limit or DEFAULT_MAX_LENGTH)
    if limit is not None and max_length > limit:
        raise ArgumentValueError(
            "max_length", f"{{arg}} {max_length} exceeds the model's {limit} positions", f"use {{arg}} {limit} or less"
        )
    return max_length


def resolve_device(name: str | None):
    """A torch device from a name (None: cuda when available, else cpu; 'cuda' under torchrun: cuda:LOCAL_RANK),
    checked by `check_device` (only a device this machine can run a model on)."""
    import torch

    from posprobe.runtime.distributed import local_cuda_device

    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(name)
    return torch.device(local_cuda_device() if name == "cuda" else name)  # under torchrun: one GPU per rank


_DEVICE_HINT = "use cpu, cuda, cuda:N, mps or auto"


def check_device(name: Any) -> Any:
    """`name` unchanged when it names a device this machine can run a model on: None (the default), 'auto', 'cpu',
    'cuda' / 'cuda:N' with that GPU present, 'mps' / 'xpu' where available; ArgumentValueError otherwise ('meta'
    holds no values, an unknown or absent device cannot run), before any weight is read."""
    if name is None or name == "auto":
        return name
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ArgumentValueError("device", f"unknown {{arg}} '{name}'", _DEVICE_HINT) from err
    if device.type == "cpu":
        return name
    if device.type not in ("cuda", "mps", "xpu"):
        why = "it holds shapes, no values" if device.type == "meta" else "posprobe runs models on cpu, cuda or mps"
        raise ArgumentValueError("device", f"{{arg}} {name} cannot run a model ({why})", _DEVICE_HINT)
    backend = getattr(torch, device.type, None) if device.type != "mps" else getattr(torch.backends, "mps", None)
    if backend is None or not backend.is_available():
        raise ArgumentValueError("device", f"{{arg}} {name}: no {device.type} device is available", "use {arg} cpu")
    count = torch.cuda.device_count() if device.type == "cuda" else getattr(backend, "device_count", lambda: 1)()
    if device.index is not None and device.index >= count:
        raise ArgumentValueError(
            "device", f"{{arg}} {name}: this machine has {count} {device.type} device(s)", f"use an index below {count}"
        )
    return name


def place_on(model, device):
    """`model` moved to `device`, or left where it is when accelerate dispatched it (`device_map`: layers on
    several devices, the CPU or disk, moved in by accelerate's hooks as they run)."""
    if getattr(model, "hf_device_map", None):
        return model
    return model.to(device)


def model_device(model):
    """The device the model's inputs go to: where its parameters live; for a model dispatched by accelerate, the
    first GPU of its device map, else the CPU (offloaded weights are brought there by accelerate's hooks)."""
    import torch

    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        gpus = [d for d in device_map.values() if isinstance(d, int) or str(d).startswith("cuda")]
        return torch.device(f"cuda:{gpus[0]}" if isinstance(gpus[0], int) else gpus[0]) if gpus else torch.device("cpu")

    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def embedding_rows(model) -> int | None:
    """How many token ids the model embeds (its input embedding's rows), or None where it cannot be read."""
    try:
        rows = model.get_input_embeddings().weight.shape[0]
    except (AttributeError, NotImplementedError, TypeError, IndexError):
        rows = getattr(text_config(model), "vocab_size", None)
    return int(rows) if isinstance(rows, int) and rows > 0 else None


def pad_token_id(model, tokenizer=None) -> int:
    """An id to fill padding with (never attended, never counted): the pad or end token when it exists."""
    cfg = text_config(model)
    vocab = getattr(cfg, "vocab_size", None) or 2**31
    for value in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(cfg, "pad_token_id", None),
        getattr(cfg, "eos_token_id", None),
    ):
        if isinstance(value, int) and 0 <= value < vocab:
            return value
    return 0


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip
MAX_MEMORY_BYTES = 2**60  # 1 EiB: past any machine's memory, so a larger size is a typo
_MEMORY_HINT = "e.g. {arg} cpu=8GiB,0=20GiB (sizes: a number of bytes, or with KB, MB, GB, KiB, MiB or GiB)"


def parse_max_memory(value: Any) -> dict | None:
    """accelerate's `max_memory` from 'cpu=2GiB,0=20GiB' (device=size; a GPU by its index) or a dict; None stays
    None. Each size ('500MB', '2GiB', '1.5GB', or a number of bytes; units in any case, all of bytes) becomes a
    whole number of bytes in 1..`MAX_MEMORY_BYTES`; a bad device or size, or a device named twice, is an
    ArgumentValueError that names the value (checked here, before any weight is read, not by accelerate)."""
    if value is None:
        return None
    parts = str(value).split(",")
    entries = list(value.items()) if isinstance(value, dict) else [_memory_entry(value, part) for part in parts]
    out: dict = {}
    for device, size in entries:
        key = int(device) if isinstance(device, str) and device.isdigit() else device
        if not (key in ("cpu", "mps") or (isinstance(key, int) and not isinstance(key, bool) and key >= 0)):
            raise ArgumentValueError(
                "max_memory", f"{{arg}} '{value}': device {device!r} is not cpu or a GPU index", _MEMORY_HINT
            )
        if key in out:
            raise ArgumentValueError("max_memory", f"{{arg}} '{value}' names {device} twice", _MEMORY_HINT)
        out[key] = _memory_bytes(value, size)
    if not out:
        raise ArgumentValueError("max_memory", "{arg} is empty", _MEMORY_HINT)
    return out


def _memory_entry(value: Any, part: str) -> tuple[str, str]:
    """(device, size) of one 'DEVICE=SIZE' entry of `value`."""
    device, _, size = part.strip().partition("=")
    if not device.strip() or not size.strip():
        raise ArgumentValueError(
            "max_memory", f"{{arg}} '{value}': each entry is DEVICE=SIZE with DEVICE cpu or a GPU index", _MEMORY_HINT
        )
    return device.strip(), size.strip()


def _memory_bytes(value: Any, size: Any) -> int:
    """`size` (an int of bytes or a string with a unit) as a whole number of bytes in 1..`MAX_MEMORY_BYTES`."""
    import math
    import re

    if isinstance(size, int) and not isinstance(size, bool):
        number, scale = size, 1
    else:
        match = re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)", str(size).strip())
        scale = _SIZE_UNITS.get(match.group(2).upper()) if match else None
        if scale is None:
            raise ArgumentValueError(
                "max_memory", f"{{arg}} '{value}': size '{size}' is not a number of bytes or a size", _MEMORY_HINT
            )
        text = match.group(1)
        number = int(text) if text.lstrip("+-").isdigit() else float(text)  # a count of bytes exact
    if not math.isfinite(number) or number * scale > MAX_MEMORY_BYTES:
        raise ArgumentValueError(
            "max_memory", f"{{arg}} '{value}': size '{size}' is more than any machine's memory", _MEMORY_HINT
        )
    if int(number * scale) < 1:
        raise ArgumentValueError("max_memory", f"{{arg}} '{value}': size '{size}' is not positive", _MEMORY_HINT)
    return int(number * scale)


def check_max_memory(device: Any, max_memory: Any) -> dict | None:
    """`parse_max_memory(max_memory)` with `device` checked (`check_device`), refused in one line without `device`
    'auto' (the check a command makes before any folder is created or weight read; `dispatch_settings` makes it
    again)."""
    check_device(device)
    max_memory = parse_max_memory(max_memory)
    if max_memory is not None and device != "auto":
        raise ArgumentValueError("max_memory", "{arg} applies only with --device auto", "add --device auto")
    return max_memory


def dispatch_settings(device: Any, max_memory: Any) -> dict:
    """`from_pretrained` keywords for `device` 'auto' (accelerate's big-model inference: layers spread over the
    GPUs, the CPU and, past `max_memory`, a temporary folder on disk, removed when the process ends); {} otherwise.
    `max_memory` without `device` 'auto' is refused."""
    max_memory = check_max_memory(device, max_memory)
    if device != "auto":
        return {}
    import atexit
    import shutil
    import tempfile

    from posprobe.runtime.distributed import env_rank_and_world

    if env_rank_and_world()[1] > 1:
        raise ArgumentValueError(
            "device",
            "{arg} auto spreads one model over every device of the machine, which torchrun's ranks would each take",
            "run {arg} auto in one process, or torchrun without it",
        )
    folder = tempfile.mkdtemp(prefix="posprobe-offload-")
    atexit.register(shutil.rmtree, folder, True)
    return {"device_map": "auto", "max_memory": max_memory, "offload_folder": folder}


def capture_device(model, device: Any):
    """Where a capture's inputs and sums go: the model's input device for `device` 'auto' (a dispatched model),
    else `resolve_device(device)`."""
    return model_device(model) if device == "auto" else resolve_device(device)


def load_for_capture(model: Any, allow_pickle: bool, need_tokenizer: bool, dispatch: dict | None = None):
    """(ModelSource or None, model, tokenizer or None) for a hub id, folder, None (packaged MiniLM), its
    `ModelSource` (resolved by the command: not again), or a loaded model (which carries no tokenizer: pass token
    ids instead). Loaded with eager attention; `dispatch`: the
    keywords of `dispatch_settings` (accelerate's device map)."""
    from torch import nn

    if isinstance(model, nn.Module):
        if need_tokenizer:
            raise PosprobeError("texts need a tokenizer, and a model object carries none", "pass input_ids instead")
        return None, model, None
    from transformers.utils import logging as hf_logging

    from posprobe.checkpoint import resolve_model
    from posprobe.checkpoint.loading import load_tokenizer
    from posprobe.retrofitting.loading import load_model

    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    tokenizer = None
    if need_tokenizer:
        tokenizer = load_tokenizer(
            source.path, "use a model folder that holds its tokenizer files, or pass input_ids from the library"
        )
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the weight-loading bar would mix with the caller's progress bar
    try:
        net = load_model(
            source, _model_class(source.model_type), allow_pickle=allow_pickle, attn_implementation="eager",
            **(dispatch or {}),
        )  # fmt: skip
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return source, net, tokenizer


def _model_class(model_type: str):
    """The auto class a capture loads a checkpoint with: AutoModel, or AutoModelForCausalLM for a type that has a
    causal LM but no base model class (TrOCR's decoder)."""
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    if model_type not in MODEL_MAPPING_NAMES and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    return AutoModel


def layer_kind_words(model, n: int, stack: str = "encoder") -> list[str] | None:
    """How each layer of `stack` attends over `n` positions, in words (`families.windows.LayerKind.describe`:
    'global', 'local |k| <= 511, rope theta 10000', 'global, NoPE ...', a hybrid's 'no softmax attention, ...: no
    positional score'; a pooled model's layers past its first block, `capture.pooled`), read from the loaded model's
    config; None for a model outside the family table."""
    from posprobe.checkpoint.in_memory import StateDictReader, source_from_model
    from posprobe.families.context import ModelContext

    try:
        ctx = ModelContext(source_from_model(model), StateDictReader(model))
        words = [kind.describe() for kind in ctx.layer_kinds(n, stack)]
    except PosprobeError:
        return None
    if stack == "encoder" and "pooled_blocks" in ctx.family.tensors:  # Funnel: its later blocks and its decoder
        from posprobe.capture.pooled import pooled_layer_words

        words += pooled_layer_words(model)
    return words
