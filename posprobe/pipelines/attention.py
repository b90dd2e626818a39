"""Empirical positional profiles from real text (SPEC §10): run a model on texts through the capture layer
(`posprobe.capture`: batches, the recording attention function checked against eager attention on the first
batch) and reduce its attention with `posprobe.analysis.empirical.EmpiricalAccumulator`.
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
from posprobe.capture import (
    RECORD_NAME,
    capture,
    check_model,
    load_for_capture,
    register_recording_attention,
    resolve_device,
    resolve_max_length,
)
from posprobe.errors import PosprobeError
from posprobe.validation import as_bool, as_int

TEXT_SUFFIXES = (".txt", ".jsonl", ".csv")
MAX_ACCUMULATOR_BYTES = 16 * 2**30


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
    if max_length is not None:
        max_length = as_int(max_length, "max_length", minimum=2)
    batch_size = as_int(batch_size, "batch_size", minimum=1, maximum=65536)
    if max_texts is not None:
        max_texts = as_int(max_texts, "max_texts", minimum=1)
    exclude_special = as_bool(exclude_special, "exclude_special")
    if (texts is None) == (input_ids is None):
        raise PosprobeError("pass exactly one of texts and input_ids", "texts for strings, input_ids if tokenised")
    started = time.perf_counter()
    source, net, tokenizer = load_for_capture(model, allow_pickle, need_tokenizer=texts is not None)
    n_layers, n_heads = check_model(net)
    max_length = resolve_max_length(net, max_length)
    if EmpiricalAccumulator.nbytes(n_layers, n_heads, max_length) > MAX_ACCUMULATOR_BYTES:
        raise PosprobeError(
            f"max_length {max_length} needs {EmpiricalAccumulator.nbytes(n_layers, n_heads, max_length) / 2**30:.1f} "
            f"GiB of accumulators ({n_layers} layers x {n_heads} heads x n² float64)",
            "use a smaller --max-length",
        )
    device = resolve_device(device)
    net = net.to(device)
    acc = EmpiricalAccumulator(n_layers, n_heads, max_length, device)
    summary = capture(
        net,
        [acc],
        texts,
        tokenizer=tokenizer,
        input_ids=input_ids,
        special_ids=special_ids or (),
        max_length=max_length,
        batch_size=batch_size,
        max_texts=max_texts,
        exclude_special=exclude_special,
        verify=verify,
        progress=progress,
    )
    n_texts = summary.n_texts
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


__all__ = [
    "RECORD_NAME",
    "AttentionResult",
    "attention_profiles",
    "check_texts",
    "iter_texts",
    "register_recording_attention",
    "write_attention",
]
