"""Read single tensors of a GGUF file lazily, under their transformers names, de-quantised to float64 numpy.

`GGUFWeightReader` offers what `weights.WeightReader` offers (keys / find_suffix / get / row_mean / shape /
stored_dtype), so the family table and the model reader work unchanged on a GGUF file. It reads the checked
header (`gguf_format`), then only the bytes of the tensors asked for, one tensor at a time (a vocabulary-sized
word table a chunk of rows at a time), and de-quantises them with the gguf package's own `gguf.quants.dequantize`
(float32, as transformers loads them), then widens to float64 (exact).

Names and layouts are transformers' own: the GGUF -> transformers name map is built as transformers' GGUF loader
builds it (gguf's `TensorNameMap` of the file's architecture, applied to the state-dict names of the model class
transformers would build, on the meta device: no memory, no weights), and every tensor goes through transformers'
tensor processor for the architecture (`TENSOR_PROCESSORS`), which undoes llama.cpp's conversions: for Llama-
architecture files the row permutation of Q and K (llama.cpp interleaves the two halves of every rotary head;
the processor swaps them back per head: Q with the query heads, K with the key/value heads), Bloom's fused QKV
order, GPT-2's transposed projections, Gemma's norm offsets. So each tensor equals the parameter of
`from_pretrained(folder, gguf_file=...)` (tested tensor by tensor).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np

from posprobe.checkpoint.gguf_format import CORRUPT_HINT, GGUFHeader, GGUFTensorInfo, read_gguf_header, shown
from posprobe.checkpoint.gguf_source import GGUF_HINT
from posprobe.checkpoint.resolve import shortest_suffix
from posprobe.errors import PosprobeError, first_line

_PLAIN = {"F32": np.float32, "F16": np.float16}  # stored as plain arrays (the others as blocks of bytes)


class GGUFWeightReader:
    """The `WeightReader` interface over one GGUF file: `config` is its transformers config dict (`ModelSource`'s).

    `keys()` are transformers state-dict names (e.g. 'model.layers.0.self_attn.q_proj.weight') of the tensors the
    file stores (a tied output head the file does not store is not listed, as for a safetensors checkpoint);
    `get(name)` float64; `quant_type(name)` the ggml type it is stored in ('Q4_1'); `stored_dtype(name)` 'F32',
    the dtype transformers gives the de-quantised tensor."""

    def __init__(self, path, config: dict, header: GGUFHeader | None = None, name: str | None = None):
        self.path = Path(path)
        self.name = name or self.path.name  # what the phase line calls it
        self.folder = self.path.parent
        self._header = header
        self.config = config
        self._shapes: dict[str, tuple[int, ...]] = {}

    @property
    def header(self) -> GGUFHeader:
        """The file's checked header, read on first use."""
        if self._header is None:
            self._header = read_gguf_header(self.path)
        return self._header

    @property
    def layers_checked(self) -> bool:
        """True: the file's layer count was checked against its `blk.N` tensors when its source was resolved
        (`gguf_source.check_block_count`), so `ModelContext` need not look the layers' query weights up."""
        return True

    @cached_property
    def _mapped(self) -> tuple[dict[str, list[GGUFTensorInfo]], list[str], dict[str, str]]:
        """(transformers name -> the GGUF tensor(s) it comes from, those names, GGUF name -> transformers name),
        built on the first access to a tensor: transformers' name map costs seconds (its GGUF loader and the model
        class are imported), which a command that refuses its arguments from the config never pays."""
        from posprobe.runtime.phases import phase

        phase(f"reading the weights of {self.name}")
        gguf_to_hf = hf_name_map(self.header, self.config)
        sources: dict[str, list[GGUFTensorInfo]] = {}
        for name, info in self.header.tensors.items():
            if name in gguf_to_hf:
                sources.setdefault(gguf_to_hf[name], []).append(info)
        return sources, list(sources), gguf_to_hf

    @property
    def _sources(self) -> dict[str, list[GGUFTensorInfo]]:
        return self._mapped[0]

    @property
    def _names(self) -> list[str]:
        return self._mapped[1]

    @property
    def _gguf_to_hf(self) -> dict[str, str]:
        return self._mapped[2]

    @cached_property
    def processor(self):
        """transformers' tensor processor for the file's architecture (identity where it has none)."""
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        return TENSOR_PROCESSORS.get(self.header.architecture, TensorProcessor)(config=self.config)

    # -- access ------------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._names)

    def __contains__(self, key: str) -> bool:
        return key in self._sources

    def find_suffix(self, suffix: str) -> str | None:
        return shortest_suffix(self._names, suffix)

    def quant_type(self, key: str) -> str | None:
        """The ggml type tensor `key` is stored in ('Q4_1', 'Q8_0', 'F32', ...); None for an unknown key."""
        sources = self._sources.get(key)
        return None if not sources else sources[0].type_name

    def stored_dtype(self, key: str) -> str | None:
        """'F32' for every tensor: de-quantised GGUF tensors are float32, the dtype transformers loads them in (what
        a model's dtype-dependent constants, e.g. Gemma's embedding scale, are rounded to); None for an unknown key.
        The stored ggml type is `quant_type`."""
        return "F32" if key in self._sources else None

    def shape(self, key: str) -> tuple[int, ...] | None:
        """The shape of tensor `key` as transformers holds it (after its processor), from the header alone."""
        if key not in self._sources:
            return None
        if key not in self._shapes:
            sources = self._sources[key]
            if len(sources) == 1:
                probe = np.broadcast_to(np.float32(0), sources[0].shape)  # no memory: shape only
                with np.errstate(all="ignore"):
                    weights, name, _ = self._process(probe, sources[0].name, key)
                self._shapes[key] = tuple(weights.shape) if name is not None else tuple(self.get(key).shape)
            else:
                self._shapes[key] = tuple(self.get(key).shape)
        return self._shapes[key]

    def get(self, key: str) -> np.ndarray:
        """Tensor `key` de-quantised, as a float64 array laid out as transformers holds it."""
        if key not in self._sources:
            raise PosprobeError(f"GGUF file '{self.path}' has no tensor '{key}'", CORRUPT_HINT)
        parsed: dict = {"tensors": {}}
        result = None
        for info in self._sources[key]:
            weights, name, parsed = self._process(self._dequantize(info), info.name, key, parsed)
            if name is not None:
                result = weights
        if result is None:  # the processor put it (merged, split or renamed) among its parsed tensors
            tensor = parsed["tensors"].get(key)
            if tensor is None:
                raise PosprobeError(
                    f"transformers' GGUF loader does not give tensor '{key}' of '{self.path}' on its own",
                    "posprobe reads GGUF tensors one at a time; use the model's safetensors checkpoint",
                )
            result = tensor.detach().float().numpy()
        return _finite(np.asarray(result, dtype=np.float64), key, self.path)

    def row_mean(self, key: str, chunk_rows: int = 1024) -> np.ndarray:
        """Mean over the rows of 2-D tensor `key` (float64), de-quantising `chunk_rows` rows at a time where the
        architecture's processor leaves the tensor as stored."""
        sources = self._sources.get(key)
        if not sources or len(sources) != 1 or len(sources[0].shape) != 2 or not self._stored_as_is(key):
            return self.get(key).mean(axis=0)
        info = sources[0]
        rows, cols = info.shape
        if rows == 0:
            raise PosprobeError(f"tensor '{key}' in '{self.path}' has no rows", "the checkpoint is malformed")
        total = np.zeros(cols, dtype=np.float64)
        for start in range(0, rows, chunk_rows):
            stop = min(start + chunk_rows, rows)
            total += self._dequantize(info, start, stop).astype(np.float64).sum(axis=0)
        return _finite(total / rows, key, self.path)

    # -- internals ---------------------------------------------------------------------------------
    def _stored_as_is(self, key: str) -> bool:
        """True when the processor returns tensor `key` unchanged (so that row chunks may be read on their own)."""
        info = self._sources[key][0]
        probe = np.zeros((1, *info.shape[1:]), dtype=np.float32)
        try:
            weights, name, _ = self._process(probe, info.name, key)
        except PosprobeError:
            return False
        return weights is probe and name == info.name

    def _process(self, weights: np.ndarray, gguf_name: str, key: str, parsed: dict | None = None):
        """(weights, name, parsed) after transformers' processor for the architecture."""
        parsed = {"tensors": {}} if parsed is None else parsed
        try:
            result = self.processor.process(
                weights=weights, name=gguf_name, tensor_key_mapping=self._gguf_to_hf, parsed_parameters=parsed
            )
        except Exception as err:  # reshapes that do not fit the config, and whatever else a processor raises
            raise PosprobeError(
                f"transformers' GGUF loader cannot convert tensor {shown(gguf_name)} of '{self.path}' "
                f"({first_line(err, 160)})",
                "the GGUF metadata does not match its tensors; re-convert the file",
            ) from err
        return result.weights, result.name, parsed

    def _dequantize(self, info: GGUFTensorInfo, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows start..stop-1 (first axis) of a tensor, de-quantised by the gguf package (float32)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        shape = info.shape
        rows = shape[0] if len(shape) > 1 else 1
        stop = rows if stop is None else stop
        row_bytes = info.nbytes // rows if rows else 0
        want = (stop - start) * row_bytes
        try:
            with open(self.path, "rb") as fh:
                fh.seek(info.start + start * row_bytes)
                data = fh.read(want)
        except OSError as err:
            raise PosprobeError(f"cannot read '{self.path}': {err.strerror or err}", CORRUPT_HINT) from err
        if len(data) != want:  # the file shrank after its header was checked
            raise PosprobeError(f"'{self.path}' ended before the data of tensor {shown(info.name)} did", CORRUPT_HINT)
        part = ((stop - start) if len(shape) > 1 else shape[0], *shape[1:])
        if info.type_name in _PLAIN:
            array = np.frombuffer(data, dtype=_PLAIN[info.type_name]).reshape(part)
        else:
            blocks = part[-1] // info.block_size * info.type_size  # bytes per row
            array = np.frombuffer(data, dtype=np.uint8).reshape(*part[:-1], blocks)
        try:
            return dequantize(array, GGMLQuantizationType(info.ggml_type))
        except NotImplementedError as err:
            raise PosprobeError(
                f"tensor {shown(info.name)} of '{self.path}' is stored as {info.type_name}, which the gguf package "
                "cannot de-quantise",
                GGUF_HINT,
            ) from err


_NAME_MAPS: dict[tuple[str, str], dict[str, str]] = {}  # (architecture, config's JSON) -> `hf_name_map`


def hf_name_map(header: GGUFHeader, config: dict) -> dict[str, str]:
    """GGUF tensor name -> transformers state-dict name, as transformers' GGUF loader maps them: gguf's
    `TensorNameMap` of the file's architecture applied to the names of the model class transformers builds for
    the config (and, with a module prefix, of its submodules, for files converted from a base model).

    Built once per architecture and config in a process (the config without `_name_or_path`, which names the file
    and not the model; a copy is returned): building it imports transformers' GGUF loader and builds the model
    class on the meta device, which every read and every command of a report would repeat."""
    shape = {k: v for k, v in config.items() if k != "_name_or_path"}
    key = (str(header.architecture), json.dumps(shape, sort_keys=True, default=str))
    if key not in _NAME_MAPS:
        _NAME_MAPS[key] = _build_name_map(header, config)
    return dict(_NAME_MAPS[key])


def _build_name_map(header: GGUFHeader, config: dict) -> dict[str, str]:
    """`hf_name_map`, built anew."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == header.architecture), None)
    if arch is None:
        raise PosprobeError(
            f"'{header.path}' is a GGUF file of architecture {shown(header.architecture)}, which the installed gguf "
            "package does not know",
            "upgrade the gguf package, or use the model's safetensors checkpoint",
        )
    model = meta_model(config)
    name_map = get_tensor_name_map(arch, int(getattr(model.config, "num_hidden_layers", 0) or 0))
    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=config)

    def names_of(module, prefix: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for hf_name in module.state_dict(keep_vars=True):
            hf_name = processor.preprocess_name(hf_name)
            base, suffix = hf_name, ""
            if hf_name.endswith((".weight", ".bias")):
                base, suffix = hf_name.rsplit(".", 1)
                suffix = "." + suffix
            gguf_name = name_map.get_name(base)
            if gguf_name is None:
                processor.perform_fallback_tensor_mapping(found, suffix, prefix, hf_name)
            else:
                found[gguf_name + suffix] = prefix + hf_name
        for child_name, child in module.named_children():
            for gguf_name, hf_name in names_of(child, f"{prefix}{child_name}.").items():
                found.setdefault(gguf_name, hf_name)
        return found

    return names_of(model, "")


def meta_model(config: dict):
    """The model transformers' `from_pretrained(..., gguf_file=...)` builds for `config` (its `architectures`
    class, else the causal-LM, sequence-to-sequence or base class), on the meta device: names and shapes only."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = CONFIG_MAPPING[config["model_type"]].from_dict(dict(config))
    names = config.get("architectures") or []
    chosen = getattr(transformers, str(names[0]), None) if names else None
    builders = [chosen._from_config] if isinstance(chosen, type) and hasattr(chosen, "_from_config") else []
    builders += [transformers.AutoModelForCausalLM.from_config, transformers.AutoModelForSeq2SeqLM.from_config]
    builders += [transformers.AutoModel.from_config]
    last: Exception | None = None
    for build in builders:
        try:
            with torch.device("meta"):
                return build(cfg)
        except (ValueError, KeyError) as err:  # the auto class has no entry for this model type
            last = err
        except Exception as err:  # the model class fails on the config (a size of 0, a number that is a string)
            raise PosprobeError(
                f"transformers cannot build a model from the GGUF metadata of '{config.get('_name_or_path')}' "
                f"({type(err).__name__}: {first_line(err, 160)})",
                GGUF_HINT,
            ) from err
    raise PosprobeError(
        f"transformers has no model class for the GGUF model type '{config['model_type']}'", GGUF_HINT
    ) from last


def _finite(array: np.ndarray, key: str, where) -> np.ndarray:
    if not np.all(np.isfinite(array)):
        raise PosprobeError(
            f"tensor '{key}' in '{where}' contains NaN or infinite values", "the checkpoint is broken; use another one"
        )
    return array
