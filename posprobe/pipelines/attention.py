"""Empirical positional profiles from real text (SPEC §10): run a model on texts, stream its attention into
`posprobe.analysis.empirical.EmpiricalAccumulator`.

Scores are captured by one attention function registered in transformers' `AttentionInterface` under
`RECORD_NAME` (its masks come from the stock `eager_mask`, so they are exactly the eager path's additive masks):
it computes what the model's eager attention computes (scaling, the mask/bias argument — padding, causality,
sliding windows, relative biases or ALiBi where a family passes them there —, grouped-query heads, softcapping),
hands S and A to the accumulator, and returns the same output. The first batch is also run with the model's own
"eager" attention and the two outputs must agree, so a family this function does not reproduce is refused
instead of measured wrongly. No model code is edited.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posprobe.analysis.empirical import EmpiricalAccumulator, EmpiricalProfiles, profile_correlation
from posprobe.errors import PosprobeError
from posprobe.validation import as_bool, as_int

RECORD_NAME = "posprobe-record"
TEXT_SUFFIXES = (".txt", ".jsonl", ".csv")
MAX_ACCUMULATOR_BYTES = 16 * 2**30
DEFAULT_MAX_LENGTH = 128
_ACTIVE: list[_Recorder] = []  # the recorder of the forward pass running now (at most one)


# -- texts -------------------------------------------------------------------------------------------
HUB_PREFIX = "hub:"


def parse_hub_texts(text: str) -> tuple[str, str | None, str] | None:
    """`hub:NAME:SPLIT` or `hub:NAME:CONFIG:SPLIT` -> (name, config, split); None for anything else (a file)."""
    if not str(text).startswith(HUB_PREFIX):
        return None
    parts = str(text)[len(HUB_PREFIX) :].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise PosprobeError(
            f"'{text}' is not a hub dataset spec",
            "write hub:NAME:SPLIT or hub:NAME:CONFIG:SPLIT, e.g. hub:nyu-mll/glue:cola:validation",
        )
    return parts[0], (parts[1] if len(parts) == 3 else None), parts[-1]


def _hub_texts(spec: tuple[str, str | None, str], column: str | None) -> Iterator[str]:
    """The texts of column `column` of a hub dataset split (cache only when offline)."""
    from posprobe.glue.data import load_hub_dataset

    name, config, split = spec
    where = f"hub:{name}" + (f":{config}" if config else "") + f":{split}"
    if not column:
        raise PosprobeError(f"'{where}' is a dataset: which column holds the texts?", "pass --column NAME")
    table = load_hub_dataset(name, config, split, f"'{where}'", "pass a local .txt, .jsonl or .csv file with --text")
    if column not in table.column_names:
        raise PosprobeError(
            f"'{where}' has no column '{column}' (columns: {', '.join(table.column_names)})",
            "pass one of them with --column",
        )
    for number, value in enumerate(table[column], 1):
        if not isinstance(value, str):
            raise PosprobeError(
                f"{where} row {number}: column '{column}' is not text ({value!r})", "choose a text column"
            )
        if value.strip():
            yield value


def _text_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".csv"):
        return suffix[1:]
    return "txt"


def iter_texts(path: str | Path, column: str | None = None) -> Iterator[str]:
    """The texts of `path`: a text file (one text per non-empty line), `.jsonl` / `.csv` with `column`, or a hub
    dataset split `hub:NAME[:CONFIG]:SPLIT` with `column`.

    Raises PosprobeError naming the file and line for a missing column, malformed JSON or a non-text value."""
    spec = parse_hub_texts(str(path))
    if spec is not None:
        yield from _hub_texts(spec, column)
        return
    path = Path(path).expanduser()
    kind = _text_format(path)
    if kind != "txt" and not column:
        raise PosprobeError(f"'{path}' is a .{kind} file: which column holds the texts?", "pass --column NAME")
    if kind == "txt" and column:
        raise PosprobeError(f"--column applies to .jsonl and .csv files, not '{path.name}'", "drop --column")
    try:
        with open(path, encoding="utf-8", newline="" if kind == "csv" else None) as fh:
            if kind == "txt":
                for line in fh:
                    text = line.rstrip("\r\n")
                    if text.strip():
                        yield text
            elif kind == "jsonl":
                for number, line in enumerate(fh, 1):
                    if line.strip():
                        yield _field(_json_record(line, path, number), column, path, number)
            else:
                reader = csv.DictReader(fh)
                if reader.fieldnames is not None and column not in reader.fieldnames:
                    raise PosprobeError(
                        f"'{path}' has no column '{column}' (columns: {', '.join(reader.fieldnames)})",
                        "pass one of them with --column",
                    )
                for record in reader:
                    yield _field(record, column, path, reader.line_num)
    except UnicodeDecodeError as err:
        raise PosprobeError(f"'{path}' is not UTF-8 text ({err.reason})", "convert it to UTF-8") from err


def _json_record(line: str, path: Path, number: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise PosprobeError(f"{path}:{number}: not valid JSON ({err.msg})", "one JSON object per line") from err
    if not isinstance(record, dict):
        raise PosprobeError(f"{path}:{number}: a JSON object was expected", "one JSON object per line")
    return record


def _field(record: dict, column: str, path: Path, number: int) -> str:
    if column not in record:
        raise PosprobeError(
            f"{path}:{number}: no column '{column}' (fields: {', '.join(map(str, record))})",
            "pass one of them with --column",
        )
    value = record[column]
    if not isinstance(value, str):
        raise PosprobeError(f"{path}:{number}: column '{column}' is not text ({value!r})", "choose a text column")
    return value


def check_texts(path: str | Path, column: str | None = None, max_texts: int | None = None) -> int:
    """Validate the text file before any work (exists, readable, right column, not empty); return the number
    of texts that will be used (at most `max_texts`)."""
    if parse_hub_texts(str(path)) is None and not Path(path).expanduser().is_file():
        raise PosprobeError(f"text file '{path}' does not exist", "pass a .txt, .jsonl or .csv file with --text")
    count = 0
    for _ in iter_texts(path, column):
        count += 1
        if max_texts is not None and count >= max_texts:
            break
    if count == 0:
        raise PosprobeError(f"'{path}' holds no texts", "pass a file with at least one non-empty text")
    return count


# -- the attention function ---------------------------------------------------------------------------
class _Recorder:
    """Feeds one forward pass's attention calls (in depth order) into the accumulator."""

    def __init__(self, accumulator: EmpiricalAccumulator):
        self.acc = accumulator
        self.calls = 0
        self.token_ok = None  # (B, m) bool: real tokens that count (not padding, not excluded specials)
        self._cache: tuple[Any, Any] | None = None

    def begin(self, token_ok) -> None:
        self.calls, self.token_ok, self._cache = 0, token_ok, None

    def _counted(self, mask, m: int):
        """(B, m, m) bool: pairs the model lets query i see (its mask) between counted tokens."""
        import torch

        key = None if mask is None else (mask.data_ptr(), tuple(mask.shape))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        ok = self.token_ok
        pairs = ok[:, :, None] & ok[:, None, :]
        if mask is not None:
            allowed = mask[:, 0, :, :m] if mask.dim() == 4 else mask[..., :m]
            if allowed.dtype != torch.bool:
                allowed = allowed > torch.finfo(allowed.dtype).min / 2
            pairs = pairs & allowed.expand_as(pairs)
        self._cache = (key, pairs)
        return pairs

    def record(self, query, scores, probs, mask) -> None:
        layer = self.calls
        self.calls += 1
        B, m = self.token_ok.shape
        if scores.shape[-2] != m or scores.shape[-1] != m:
            raise PosprobeError(
                f"an attention call saw {scores.shape[-2]} queries and {scores.shape[-1]} keys for sequences of {m}",
                "only self-attention over the input (encoders and decoders, no cache, no cross-attention) is supported",
            )
        if layer >= self.acc.n_layers:
            raise PosprobeError(
                f"the model ran more attention calls ({layer + 1}) than it has layers ({self.acc.n_layers})",
                "models with several attention stacks (encoder-decoder, vision towers) are not supported",
            )
        self.acc.add(layer, scores.detach(), probs.detach(), self._counted(mask, m))


def recording_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
):
    """Eager attention that also records scores and probabilities; transformers' attention-function contract.

    query (B, H, m, d_h), key/value (B, H_kv, m, d_h) (grouped-query heads repeated as `repeat_kv` does),
    attention_mask additive (B, 1, m, m) or None. S = QK^T * scaling (softcapped when the family asks),
    plus the mask/bias; A = softmax(S) in float32, cast back. Returns ((B, m, H, d_h), A).
    """
    import torch

    if kwargs.get("s_aux") is not None:
        raise PosprobeError(
            "this model uses attention sinks, which posprobe attention does not reproduce",
            "use a model without sinks",
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask[..., : key.shape[-2]]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    dropped = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(dropped, value).transpose(1, 2).contiguous()
    if _ACTIVE:
        _ACTIVE[-1].record(query, scores, probs, attention_mask)
    return out, probs


def register_recording_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(RECORD_NAME, recording_attention)
    AttentionMaskInterface.register(RECORD_NAME, eager_mask)


# -- model access -------------------------------------------------------------------------------------
def _text_config(model):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _check_model(model) -> tuple[int, int]:
    """(layers, heads) of a model this command can record; PosprobeError otherwise."""
    from posprobe.retrofitting import is_retrofitted

    kind = getattr(model.config, "model_type", "unknown")
    if is_retrofitted(model):
        raise PosprobeError(
            "this model is retrofitted with a posprobe mechanism, whose attention this command does not record",
            "measure the original checkpoint",
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise PosprobeError(
            f"'{kind}' is an encoder-decoder model; only encoders and decoders are supported",
            "pass an encoder (BERT-like) or a decoder (GPT-like) model",
        )
    if not (hasattr(type(model), "is_backend_compatible") and type(model).is_backend_compatible()):
        raise PosprobeError(
            f"'{kind}' models do not route attention through transformers' AttentionInterface, so their scores "
            "cannot be recorded without editing model code",
            "use a family that supports attention backends (BERT, RoBERTa, GPT-2, Llama, Mistral, Qwen, Gemma, ...)",
        )
    cfg = _text_config(model)
    layers, heads = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "num_attention_heads", None)
    if not layers or not heads:
        raise PosprobeError(f"cannot read the number of layers and heads of '{kind}'", "use a standard config")
    return int(layers), int(heads)


def max_positions(model) -> int | None:
    """Longest input the model's positions allow (RoBERTa family: table minus its reserved rows)."""
    cfg = _text_config(model)
    n = getattr(cfg, "max_position_embeddings", None)
    if n is None:
        return None
    from posprobe.families.context import reserved_rows

    return int(n) - reserved_rows(cfg.to_dict(), str(getattr(cfg, "_name_or_path", "") or "the model"))


# -- the run ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionResult:
    """Empirical profiles of every layer and head (see `EmpiricalProfiles` for the arrays and shapes).

    weights_profiles (L, H, 2n-1): the weights-based profile (faithful-mode F̂_P diagonal means over the leading
    n x n positions) where the family has one, else None; weights_correlation (L, H): Pearson r between s(k) and it
    over the offsets with data (NaN where undefined), or None.
    """

    model: str
    model_type: str
    n_texts: int
    max_length: int
    exclude_special: bool
    n_layers: int
    n_heads: int
    profiles: EmpiricalProfiles
    weights_profiles: np.ndarray | None
    weights_correlation: np.ndarray | None
    weights_note: str
    seconds: float
    text_source: str | None = None
    extra: dict = field(default_factory=dict)
    quantization: str | None = None  # a GGUF file's quantisation: the model ran on weights de-quantised from it

    @property
    def causal(self) -> bool:
        """True when no counted pair looks right (k > 0): the model's mask is causal."""
        n = self.max_length
        counts = self.profiles.pair_counts
        return bool(counts[:, n:].sum() == 0 and counts[:, : n - 1].sum() > 0)

    def metadata(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "n_texts": self.n_texts,
            "max_length": self.max_length,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "exclude_special": self.exclude_special,
            "causal": self.causal,
            "text": self.text_source,
            "n_queries": int(self.profiles.n_queries[0]),
            "n_pairs": int(self.profiles.pair_counts[0].sum()),
            "weights_profile": self.weights_note,
            "layers": list(range(self.n_layers)),
            "mode": "empirical",
            "quantization": self.quantization,
            "convention": "k = j - i (query i, key j); profiles over k = -(n-1)..n-1 increasing",
        }

    def arrays(self, profile: str = "score") -> dict[str, np.ndarray]:
        """The npz contents. `profiles` repeats `score_profiles` (or `prob_profiles`) so that `fit-tisa` reads it."""
        p = self.profiles
        out = {
            "score_profiles": p.score_profiles,
            "prob_profiles": p.prob_profiles,
            "offsets": p.offsets,
            "pair_counts": p.pair_counts[0],
            "layer_pair_counts": p.pair_counts,
            "mean_distance": p.mean_distance,
            "toeplitz_r2": p.toeplitz_r2,
            "mean_scores": p.mean_scores.astype(np.float32),
            "count_matrix": p.count_matrix[0],
            "n_queries": p.n_queries,
            "layers": np.arange(self.n_layers),
        }
        if self.weights_correlation is not None:
            out["weights_correlation"] = self.weights_correlation
            out["weights_profiles"] = self.weights_profiles
        return out

    def to_json(self, npz: str | Path | None = None, figures: list | None = None) -> dict:
        out = self.metadata() | {
            "npz": None if npz is None else str(npz),
            "mean_distance": _nulls(self.profiles.mean_distance),
            "toeplitz_r2": _nulls(self.profiles.toeplitz_r2),
            "weights_correlation": None if self.weights_correlation is None else _nulls(self.weights_correlation),
            "seconds": round(self.seconds, 3),
        }
        if figures is not None:
            out["figures"] = [str(f) for f in figures]
        return out


def _nulls(a: np.ndarray) -> list:
    """Nested lists with NaN as None (JSON null)."""
    return [_nulls(x) for x in a] if np.ndim(a) > 1 else [None if not np.isfinite(v) else float(v) for v in a]


def _batches(
    items: Iterable, tokenize: Callable, batch_size: int, chunk: int
) -> Iterator[list[tuple[list[int], list[int]]]]:
    """Batches of (ids, special mask) pairs; items are read and tokenised `chunk` at a time and sorted by length
    within the chunk (less padding), so memory never depends on the corpus size."""
    buffer: list = []

    def flush():
        encoded = tokenize(buffer)
        encoded.sort(key=lambda e: len(e[0]), reverse=True)
        for start in range(0, len(encoded), batch_size):
            yield encoded[start : start + batch_size]

    for item in items:
        buffer.append(item)
        if len(buffer) >= chunk:
            yield from flush()
            buffer = []
    if buffer:
        yield from flush()


def _pad(batch: list[tuple[list[int], list[int]]], pad_id: int, exclude_special: bool, device):
    """Right-padded (B, m) input ids, attention mask (1 = real token) and counted-token mask."""
    import torch

    m = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), m), pad_id, dtype=torch.long)
    real = torch.zeros((len(batch), m), dtype=torch.bool)
    special = torch.zeros((len(batch), m), dtype=torch.bool)
    for b, (row, spec) in enumerate(batch):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        real[b, : len(row)] = True
        special[b, : len(row)] = torch.tensor(spec, dtype=torch.bool)
    counted = real & ~special if exclude_special else real
    return ids.to(device), real.long().to(device), counted.to(device)


def attention_profiles(
    model: Any = None,
    texts: Iterable[str] | None = None,
    *,
    input_ids: Iterable[list[int]] | None = None,
    special_ids: Iterable[int] | None = None,
    max_length: int | None = None,
    max_texts: int | None = None,
    batch_size: int = 32,
    exclude_special: bool = False,
    device: str | None = None,
    allow_pickle: bool = False,
    weights_correlation: bool = True,
    verify: bool = True,
    progress: Callable[[int], None] | None = None,
    text_source: str | None = None,
) -> AttentionResult:
    """Empirical score/probability profiles, mean attention distance and mean score matrix (SPEC §10).

    model: hub id, folder, None (packaged MiniLM) or a loaded transformers model. texts: strings, tokenised
    with the model's tokenizer (special tokens added as it does) and truncated to `max_length` (default 128, or
    the model's positions if fewer); or `input_ids`: pre-tokenised sequences (no tokenizer needed; `special_ids`
    says which ids are special). Pairs are counted between real tokens that the model's mask lets attend
    (j <= i in causal models); `exclude_special` drops special tokens as queries and keys. `verify` checks on
    the first batch that the recorded attention reproduces the model's own eager attention. `progress(k)` is
    called after each batch with the number of texts it held.
    """
    import torch

    if max_length is not None:
        max_length = as_int(max_length, "max_length", minimum=2)
    batch_size = as_int(batch_size, "batch_size", minimum=1, maximum=65536)
    if max_texts is not None:
        max_texts = as_int(max_texts, "max_texts", minimum=1)
    exclude_special = as_bool(exclude_special, "exclude_special")
    if (texts is None) == (input_ids is None):
        raise PosprobeError("pass exactly one of texts and input_ids", "texts for strings, input_ids if tokenised")
    started = time.perf_counter()
    source, net, tokenizer = _load(model, allow_pickle, need_tokenizer=texts is not None)
    n_layers, n_heads = _check_model(net)
    limit = max_positions(net)
    if max_length is None:
        max_length = min(DEFAULT_MAX_LENGTH, limit or DEFAULT_MAX_LENGTH)
    if limit is not None and max_length > limit:
        from posprobe.errors import ArgumentValueError

        raise ArgumentValueError(
            "max_length", f"{{arg}} {max_length} exceeds the model's {limit} positions", f"use {{arg}} {limit} or less"
        )
    if EmpiricalAccumulator.nbytes(n_layers, n_heads, max_length) > MAX_ACCUMULATOR_BYTES:
        raise PosprobeError(
            f"max_length {max_length} needs {EmpiricalAccumulator.nbytes(n_layers, n_heads, max_length) / 2**30:.1f} "
            f"GiB of accumulators ({n_layers} layers x {n_heads} heads x n² float64)",
            "use a smaller --max-length",
        )
    device = _device(device)
    net = net.to(device).eval()
    register_recording_attention()
    previous = net.config._attn_implementation
    net.set_attn_implementation(RECORD_NAME)
    acc = EmpiricalAccumulator(n_layers, n_heads, max_length, device)
    recorder = _Recorder(acc)

    if texts is not None:
        items, tokenize = texts, _text_tokenizer(tokenizer, max_length)
    else:
        specials = set(int(x) for x in (special_ids or ()))
        items, tokenize = input_ids, _id_tokenizer(specials, max_length)
    if max_texts is not None:
        items = _take(items, max_texts)
    pad_id = _pad_id(net, tokenizer)
    n_texts = 0
    checked = not verify
    try:
        with torch.inference_mode():
            for batch in _batches(items, tokenize, batch_size, chunk=batch_size * 16):
                ids, attention, counted = _pad(batch, pad_id, exclude_special, device)
                recorder.begin(counted)
                _ACTIVE.append(recorder)
                try:
                    output = net(input_ids=ids, attention_mask=attention)
                finally:
                    _ACTIVE.remove(recorder)
                if recorder.calls != n_layers:
                    _no_recording(net, recorder.calls, n_layers)
                if not checked:
                    _verify_against_eager(net, ids, attention, output, previous)
                    checked = True
                n_texts += len(batch)
                if progress is not None:
                    progress(len(batch))
    finally:
        net.set_attn_implementation(previous if previous != RECORD_NAME else "eager")
    if n_texts == 0:
        raise PosprobeError("no texts to measure", "pass at least one non-empty text")
    profiles = acc.result()
    w_profiles, w_corr, note = (None, None, "not requested")
    if weights_correlation:
        w_profiles, note = _weights_profiles(source, max_length, n_layers)
        if w_profiles is not None:
            w_corr = profile_correlation(profiles.score_profiles, w_profiles)
    return AttentionResult(
        source.name if source is not None else type(net).__name__,
        str(getattr(net.config, "model_type", "unknown")),
        n_texts,
        max_length,
        exclude_special,
        n_layers,
        n_heads,
        profiles,
        w_profiles,
        w_corr,
        note,
        time.perf_counter() - started,
        text_source,
        quantization=None if source is None else source.quantization,
    )


def _device(name: str | None):
    import torch

    from posprobe.errors import ArgumentValueError

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ArgumentValueError("device", f"unknown {{arg}} '{name}'", "use cpu, cuda or cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ArgumentValueError("device", f"{{arg}} {name}: no CUDA device is available", "use {arg} cpu")
    return device


def _take(items: Iterable, count: int) -> Iterator:
    for index, item in enumerate(items):
        if index >= count:
            return
        yield item


def _load(model: Any, allow_pickle: bool, need_tokenizer: bool):
    """(ModelSource or None, model, tokenizer or None)."""
    from torch import nn

    if isinstance(model, nn.Module):
        tokenizer = None
        if need_tokenizer:
            raise PosprobeError("texts need a tokenizer, and a model object carries none", "pass input_ids instead")
        return None, model, tokenizer
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    from posprobe.checkpoint import resolve_model
    from posprobe.models import load_model

    source = resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
    tokenizer = _tokenizer(source) if need_tokenizer else None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the weight-loading bar would mix with the caller's progress bar
    try:
        net = load_model(str(source.path), AutoModel, allow_pickle=allow_pickle, attn_implementation="eager")
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return source, net, tokenizer


def _tokenizer(source):
    from posprobe.checkpoint.loading import load_tokenizer

    return load_tokenizer(
        source.path, "use a model folder that holds its tokenizer files, or pass input_ids from the library"
    )


def _text_tokenizer(tokenizer, max_length: int) -> Callable:
    def tokenize(texts: list[str]) -> list[tuple[list[int], list[int]]]:
        enc = tokenizer(texts, truncation=True, max_length=max_length, return_special_tokens_mask=True)
        return [
            (ids, mask) if ids else _empty(texts[i])
            for i, (ids, mask) in enumerate(zip(enc["input_ids"], enc["special_tokens_mask"]))
        ]

    return tokenize


def _empty(text: str):
    raise PosprobeError(f"the tokenizer turned the text {text[:40]!r} into no tokens", "remove empty texts")


def _id_tokenizer(specials: set[int], max_length: int) -> Callable:
    def tokenize(rows: list[list[int]]) -> list[tuple[list[int], list[int]]]:
        out = []
        for row in rows:
            ids = [int(x) for x in row][:max_length]
            if not ids:
                raise PosprobeError("an input_ids sequence is empty", "pass sequences of at least one token")
            out.append((ids, [int(x in specials) for x in ids]))
        return out

    return tokenize


def _pad_id(model, tokenizer) -> int:
    """An id to fill padding with (never attended, never counted): the pad or end token when it exists."""
    cfg = _text_config(model)
    vocab = getattr(cfg, "vocab_size", None) or 2**31
    for value in (getattr(tokenizer, "pad_token_id", None), cfg.pad_token_id, getattr(cfg, "eos_token_id", None)):
        if isinstance(value, int) and 0 <= value < vocab:
            return value
    return 0


def _no_recording(model, calls: int, layers: int) -> None:
    kind = getattr(model.config, "model_type", "unknown")
    if calls == 0:
        raise PosprobeError(
            f"'{kind}' did not call the registered attention function, so its attention cannot be recorded",
            "use a family whose attention goes through transformers' AttentionInterface",
        )
    raise PosprobeError(
        f"'{kind}' made {calls} attention calls for {layers} layers", "this model's layout is not supported"
    )


def _verify_against_eager(model, ids, attention, output, previous: str) -> None:
    """Refuse a model whose recorded attention does not reproduce its own eager attention (first batch)."""
    import torch

    model.set_attn_implementation("eager")
    try:
        reference = model(input_ids=ids, attention_mask=attention)
    finally:
        model.set_attn_implementation(RECORD_NAME)
    ours, ref = output.last_hidden_state, reference.last_hidden_state
    real = attention.bool()
    scale = ref[real].abs().max().clamp(min=1e-6)
    tol = 1e-4 if ref.dtype == torch.float32 or ref.dtype == torch.float64 else 3e-2
    gap = (ours[real] - ref[real]).abs().max() / scale
    if not torch.isfinite(gap) or gap > tol:
        raise PosprobeError(
            f"recording the attention of '{getattr(model.config, 'model_type', 'unknown')}' changes its outputs "
            f"(relative difference {float(gap):.2e} from its eager attention)",
            "this family computes attention in a way posprobe attention does not reproduce; please report it",
        )


def _weights_profiles(source, n: int, n_layers: int) -> tuple[np.ndarray | None, str]:
    """Faithful-mode F̂_P profiles (L, H, 2n-1) over the leading n x n positions, or None and why not."""
    if source is None:
        return None, "unavailable: model passed as an object (no checkpoint to read weights from)"
    from posprobe.analysis.toeplitz import diagonal_means
    from posprobe.pipelines.analysis import fhat as fhat_analysis

    try:
        rows, mode = [], "faithful"
        for layer in range(n_layers):
            result = fhat_analysis(None, layer, "faithful", source=source)
            f, mode = result.matrices, result.mode
            if f.shape[-1] < n:
                return None, f"unavailable: the position table has {f.shape[-1]} rows, fewer than max_length {n}"
            rows.append(diagonal_means(f[:, :n, :n]))
    except PosprobeError as err:
        return None, f"unavailable: {err.message}"
    what = "faithful-mode F̂_P (SPEC §3)" if mode == "faithful" else "content-free scores (SPEC §9)"
    return np.stack(rows), f"{what} diagonal means over positions 0..n-1"


# -- writing --------------------------------------------------------------------------------------------
def write_attention(result: AttentionResult, out_dir: str | Path, fmt: str = "png", window: int = 20) -> dict:
    """Write `attention.npz`, one profile figure per layer and the mean-distance chart into `out_dir`, as one
    unit (`outputs.write_files`: an interrupted or failed run leaves nothing, not even an `out_dir` it
    created). Returns the paths."""
    from posprobe import plotting_attention as plots
    from posprobe.outputs import figure_writer, write_files
    from posprobe.profile_files import write_attention as write_npz

    files = {"attention.npz": lambda p: write_npz(p, result)}
    for layer in range(result.n_layers):
        files[f"attention_profiles_layer{layer}.{fmt}"] = figure_writer(
            lambda layer=layer: plots.profile_grid(result, layer, window)
        )
    files[f"mean_distance.{fmt}"] = figure_writer(lambda: plots.mean_distance_chart(result))
    paths = list(write_files(out_dir, files).values())
    return {"npz": paths[0], "figures": paths[1:]}


__all__ = ["AttentionResult", "attention_profiles", "check_texts", "iter_texts", "write_attention"]
