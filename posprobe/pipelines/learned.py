"""`posprobe learned` (old spelling `kernels`, a hidden alias): load a retrofitted folder, read its mechanism's
parameters (and their initial values), optionally run it on real text for the mean query/key/value, and turn
them into functions of `k = j - i` (`posprobe.analysis.learned`); compare with another folder or the base
model's own profiles; write the npz and the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from posprobe.analysis.learned import ROLES, LearnedFunctions, correlation_per_head, learned_functions
from posprobe.errors import PosprobeError
from posprobe.mechanisms.catalogue import mechanism_info
from posprobe.validation import as_int, as_path

MAX_WINDOW = 4096
LEARNED_FILE = "learned_functions.npz"  # what `write_learned` writes (`kernels.npz` before: not TISA's kernels)
TEXT_MAX_LENGTH = 128
TEXT_BATCH = 16

# the dimensions of each kind of learned array (`mechanisms.reading.KINDS`, `analysis.learned`'s legend)
KIND_DIMS = {
    "head": ("layer", "head", "offset"),
    "layer": ("layer", "offset"),
    "channels": ("layer", "offset", "channel"),
    "filters": ("layer", "role", "channel", "offset"),
}


def _learned_arrays() -> dict:
    """`LEARNED_FILE`'s declaration (formats.arrays): every array of `mechanisms.reading.KINDS`, its initial twin
    and both of the compared folder's (`compare_...`; the same shapes, `learned` checks it), each optional; a
    part's own `{part}_functions`; the per-head correlations."""
    from posprobe.analysis.learned import initial_name
    from posprobe.formats.arrays import optional
    from posprobe.mechanisms.reading import KINDS

    out: dict = {"offsets": ("offset",)}
    for name, kind in {**KINDS, "*_functions": "head"}.items():
        for twin in (name, initial_name(name)):
            out[twin] = out[f"compare_{twin}"] = optional(*KIND_DIMS[kind])
    return out | {"*_profile_correlation": ("layer", "head"), "*_compare_correlation": ("layer", "head")}


@dataclass(frozen=True)
class LearnedReport:
    """The learned functions of one model, and optionally those of a second (`other`) and per-head
    correlations: `with_other[name]` and `with_profiles[name]` are `(L, H)` over shared offsets."""

    model: str
    learned: LearnedFunctions
    window: int
    radius: int
    n_text_tokens: int = 0
    other: LearnedReport | None = None
    with_other: dict[str, np.ndarray] = field(default_factory=dict)
    with_profiles: dict[str, np.ndarray] = field(default_factory=dict)
    profiles_source: str | None = None
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- loading
def _check_folder(folder) -> tuple[Path, dict]:
    """A local folder written by `retrofit` / `finetune`: (path, recipe). Checked before torch is loaded."""
    from posprobe.checkpoint import resolve_model

    path = as_path(folder, "folder")
    if not path.is_dir():
        raise PosprobeError(
            f"'{path}' is not a folder", "pass a folder written by `posprobe retrofit` or `posprobe finetune`"
        )
    source = resolve_model(str(path))
    recipe = source.config.get("posprobe")
    if not isinstance(recipe, dict) or not recipe.get("mechanism"):
        raise PosprobeError(
            f"'{path}' holds a model without a retrofitted positional mechanism",
            "pass a folder written by `posprobe retrofit` or `posprobe finetune --mechanism ...`",
        )
    return source.path, recipe


def _stack(state: dict, n_depths: int) -> dict[str, np.ndarray]:
    """`{"depth.{d}.{name}": tensor}` -> `{name: (L, ...)}` float64 arrays."""
    names = sorted({key.split(".", 2)[2] for key in state})
    return {name: np.stack([state[f"depth.{d}.{name}"].double().numpy() for d in range(n_depths)]) for name in names}


def _split_parts(mechanism: str, stacked: dict[str, np.ndarray]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """One entry per part: a combined mechanism `a+b` keeps part i's parameters under `parts.{i}.`."""
    names = mechanism.split("+")
    if len(names) == 1:
        return [(mechanism, stacked)]
    return [
        (name, {k.split(".", 2)[2]: v for k, v in stacked.items() if k.startswith(f"parts.{i}.")})
        for i, name in enumerate(names)
    ]


def read_texts(path) -> list[str]:
    """Non-empty lines of a UTF-8 text file, one sequence each."""
    path = as_path(path, "text")
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as err:
        raise PosprobeError(
            f"cannot read the text file '{path}' ({getattr(err, 'strerror', None) or err})",
            "pass a UTF-8 text file with one sentence or paragraph per line",
        ) from err
    texts = [line for line in lines if line]
    if not texts:
        raise PosprobeError(f"the text file '{path}' has no non-empty lines", "put one text per line")
    return texts


def mean_vectors(model, tokenizer, texts: list[str]) -> tuple[dict[str, np.ndarray], int]:
    """Mean query, key and value `(L, H, d_h)` over every real token of `texts` at each attention depth (the
    projection outputs the attention sees, after any mechanism rewrote them), and the token count. The texts run in
    batches of `TEXT_BATCH` on the run loop (`capture.loop.run`), the projections read by forward hooks."""

    from posprobe.capture.loop import Step, run
    from posprobe.retrofitting.attention import depth_slots, layer_shape, projection

    slots = depth_slots(model)
    modules = list({id(m): m for m, _ in slots}.values())
    shape = layer_shape(model, slots[0][0])
    H, dh = shape.num_heads, shape.head_dim
    means = _ProjectionMeans(len(slots), H * dh)
    hooks = [
        projection(model, m, role).register_forward_hook(
            lambda _mod, _args, out, role=role: means.calls[role].append(out.detach())
        )
        for m in modules
        for role in ROLES
    ]

    def steps():
        for start in range(0, len(texts), TEXT_BATCH):
            batch = tokenizer(texts[start : start + TEXT_BATCH], truncation=True, max_length=TEXT_MAX_LENGTH,
                              padding=True, return_tensors="pt")  # fmt: skip
            yield Step(batch["input_ids"], kwargs={k: v for k, v in batch.items() if k != "input_ids"})

    try:
        run(model, steps(), [means])
    finally:
        for hook in hooks:
            hook.remove()
    mean = means.sums / max(means.tokens, 1)  # (roles, depths, H·d_h)
    return {role: mean[r].view(len(slots), H, dh).numpy() for r, role in enumerate(ROLES)}, means.tokens


class _ProjectionMeans:
    """A step reducer of `mean_vectors`: `sums` (roles, depths, H·d_h) float64, per role and attention depth the sum
    over real tokens (the step's attention mask) of the projection outputs the hooks put in `calls` (one call per
    depth, in forward order); `tokens` the real tokens counted."""

    needs = ()
    rank_sums = ("sums", "tokens")

    def __init__(self, depths: int, width: int):
        import torch

        self.calls: dict[str, list] = {role: [] for role in ROLES}
        self.sums = torch.zeros(len(ROLES), depths, width, dtype=torch.float64)
        self.tokens = 0

    def add_output(self, out) -> None:
        import torch

        mask = out.step.kwargs["attention_mask"].to(torch.float64)[..., None]  # (B, n, 1)
        self.tokens += int(mask.sum())
        for r, role in enumerate(ROLES):
            for depth, projected in enumerate(self.calls[role]):
                self.sums[r, depth] += (projected.to(torch.float64) * mask).sum((0, 1))
            self.calls[role].clear()


def check_window(window) -> int | None:
    """`--window`: None (TISA 16, otherwise the clip radius) or 1..MAX_WINDOW."""
    if window is None:
        return None
    return as_int(window, "window", minimum=1, maximum=MAX_WINDOW, hint="e.g. {arg} 16 shows k = -16..16")


def learned_from_folder(
    folder, *, window: int | None = None, texts: list[str] | None = None, allow_pickle: bool = False
) -> tuple[str, LearnedFunctions, int, int, int]:
    """(name, learned functions, window used, radius, text tokens) of one retrofitted folder."""
    from posprobe.retrofitting.install import depth_slots, initial_state, mechanism_state
    from posprobe.retrofitting.loading import load_model

    path, recipe = _check_folder(folder)
    mechanism = str(recipe["mechanism"])
    radius = int(recipe.get("radius") or 8)
    if window is None:  # the mechanism's own (TISA: 16), else the clip radius
        window = mechanism_info(mechanism).window or radius
    model = load_model(path, allow_pickle=allow_pickle).eval()
    n_depths = len(depth_slots(model))
    stacked = _stack(mechanism_state(model), n_depths)
    initial = initial_state(model)
    initial_parts = None if initial is None else [p for _, p in _split_parts(mechanism, _stack(initial, n_depths))]
    means, tokens = (None, 0) if texts is None else mean_vectors(model, _folder_tokenizer(path), texts)
    offsets = np.arange(-window, window + 1)
    learned = learned_functions(mechanism, _split_parts(mechanism, stacked), offsets, initial_parts, means)
    return str(folder), learned, window, radius, tokens


# ------------------------------------------------------------------------------------------------ API
def read_learned(
    folder,
    *,
    window: int | None = None,
    text=None,
    compare=None,
    profiles=None,
    allow_pickle: bool = False,
) -> LearnedReport:
    """The learned positional functions of a retrofitted `folder` (SPEC §11).

    window: half-width W of the offsets k = -W..W (default 16 with TISA, else the clip radius r);
    text: a text file (one text per line) for the mean query/key/value of the dynamic mechanisms;
    compare: a second retrofitted folder with the same mechanism (e.g. another seed, or before/after
    fine-tuning), read with the same window and text; profiles: the base model's own head profiles (a
    `posprobe profiles` .npz, or the base model itself) to correlate with every per-head function.
    """
    window = check_window(window)
    _check_folder(folder)
    if compare is not None:
        _check_folder(compare)
    texts = read_texts(text) if text is not None else None
    name, learned, used, radius, tokens = learned_from_folder(
        folder, window=window, texts=texts, allow_pickle=allow_pickle
    )
    notes = [] if learned.initial_known else ["initial values unknown (folder written before posprobe stored them)"]
    if texts is None and mechanism_info(learned.mechanism).reads_text:
        notes.append(
            "dynamic tables shown as per-offset norms; pass --text FILE for the score of the average query/key"
        )
    report = LearnedReport(name, learned, used, radius, tokens, notes=notes)
    if compare is not None:
        other_name, other, _, _, other_tokens = learned_from_folder(
            compare, window=used, texts=texts, allow_pickle=allow_pickle
        )
        if other.mechanism != learned.mechanism:
            raise PosprobeError(
                f"'{compare}' uses mechanism '{other.mechanism}', '{folder}' uses '{learned.mechanism}'",
                "compare two folders retrofitted with the same mechanism",
            )
        with_other = {}
        for key in learned.learned_names:
            x, y = learned.arrays[key], other.arrays.get(key)
            if y is None or x.shape != y.shape:
                raise PosprobeError(
                    f"'{compare}' and '{folder}' have differently shaped '{key}' ({x.shape} vs "
                    f"{None if y is None else y.shape})",
                    "compare models of the same architecture and mechanism settings",
                )
            if learned.kind(key) == "head":
                with_other[key] = correlation_per_head(x, learned.offsets, y, other.offsets)[0]
        report = _with(
            report, other=LearnedReport(other_name, other, used, radius, other_tokens), with_other=with_other
        )
    if profiles is not None:
        report = _with(report, **_profile_correlations(learned, profiles, allow_pickle))
    return report


def _with(report: LearnedReport, **changes) -> LearnedReport:
    from dataclasses import replace

    return replace(report, **changes)


def _profile_correlations(learned: LearnedFunctions, profiles, allow_pickle: bool) -> dict:
    """Per-head correlation of every (L, H, K) function with the base model's profiles of the same layer."""
    from posprobe.pipelines.fitting import load_profiles

    data = load_profiles(str(profiles), None, "paper", allow_pickle)
    out = {}
    for key in learned.learned_names:
        if learned.kind(key) != "head":
            continue
        x = learned.arrays[key]
        if data.n_heads != x.shape[1]:
            raise PosprobeError(
                f"the profiles in '{profiles}' have {data.n_heads} heads, the model has {x.shape[1]}",
                "pass the profiles of the model this one was retrofitted from",
            )
        r = np.full(x.shape[:2], np.nan)
        for row, layer in enumerate(data.layers):
            if layer < x.shape[0]:
                r[layer] = correlation_per_head(
                    x[layer : layer + 1], learned.offsets, data.profiles[row : row + 1], data.offsets
                )[0][0]
        out[key] = r
    return {"with_profiles": out, "profiles_source": str(profiles)}


# ------------------------------------------------------------------------------------------- outputs
def write_learned(report: LearnedReport, out_dir, fmt: str = "png") -> dict:
    """Write `LEARNED_FILE` (every array, `offsets`, metadata) and the figures into `out_dir` as one unit
    (`formats.save`), after all computing succeeded; returns {"npz": path, "figures": [paths]}."""
    from posprobe.formats.save import declared_file, figure_file, save_files
    from posprobe.plotting import learned as pk

    learned = report.learned
    arrays = {"offsets": learned.offsets, **learned.arrays}
    for key, r in report.with_profiles.items():
        arrays[f"{key}_profile_correlation"] = r
    if report.other is not None:
        for key, value in report.other.learned.arrays.items():
            arrays[f"compare_{key}"] = value
        for key, r in report.with_other.items():
            arrays[f"{key}_compare_correlation"] = r
    files = [declared_file(LEARNED_FILE, metadata(report), arrays, _learned_arrays())]
    files += [figure_file(f"{stem}.{fmt}", lambda fig=fig: fig) for stem, fig in pk.learned_figures(report)]
    return save_files(out_dir, files)


def metadata(report: LearnedReport) -> dict:
    learned = report.learned
    return {
        "model": report.model,
        "mechanism": learned.mechanism,
        "parts": list(learned.parts),
        "convention": "k = j - i",
        "window": report.window,
        "radius": report.radius,
        "initial_known": learned.initial_known,
        "text_tokens": report.n_text_tokens,
        "compare": None if report.other is None else report.other.model,
        "profiles": report.profiles_source,
        "shapes": {k: list(v.shape) for k, v in learned.arrays.items()},
    }


def summary(report: LearnedReport) -> dict:
    """Per learned array: shape, largest |value| and largest |change from init| (None when unknown)."""
    learned = report.learned
    out = {}
    for key in learned.learned_names:
        change = learned.change(key)
        out[key] = {
            "shape": list(learned.arrays[key].shape),
            "max_abs": float(np.abs(learned.arrays[key]).max()),
            "max_abs_change": None if change is None else float(np.abs(change).max()),
        }
        if key in report.with_profiles:
            out[key]["profile_correlation"] = _nan_list(report.with_profiles[key])
        if key in report.with_other:
            out[key]["compare_correlation"] = _nan_list(report.with_other[key])
    return out


def _nan_list(x: np.ndarray) -> list:
    return [[None if np.isnan(v) else round(float(v), 6) for v in row] for row in np.asarray(x)]


def _folder_tokenizer(folder: Path):
    from posprobe.checkpoint.loading import load_tokenizer

    return load_tokenizer(
        folder,
        "pass a folder written by `posprobe retrofit` / `finetune` (they copy the tokenizer), or leave out --text",
    )
