"""`posprobe states --checkpoints`: the SPEC §16 numbers of several checkpoints of one model, against the training
step (does translation invariance grow during training, as the TISA paper suggests?).

Checkpoints (`list_checkpoints`): model folders, `.gguf` files (where posprobe reads them), hub ids with a revision
(`ID@REVISION`, e.g. Pythia's `EleutherAI/pythia-70m@step3000`), or a training run's folder, which stands for its
`checkpoint-*` subfolders (what a Trainer run leaves). The step of each is its `trainer_state.json`'s
`global_step`, else the number in its name (`checkpoint-500`, `step3000`); checkpoints are ordered by step when
every one has a step, else kept in the order given (the x axis is then that order). Each checkpoint is one
`posprobe states` run (`pipelines.states.states`) on the same texts; memory is one run's at a time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posprobe.errors import PosprobeError, first_line
from posprobe.formats.save import OutputFile, Saves, arrays_file, figure_file, save
from posprobe.pipelines.states_result import PER_LAYER, StatesResult, _nulls
from posprobe.results import ResultMixin

_STEP_IN_NAME = re.compile(r"(?:checkpoint|step)[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a series: `model` (folder, file or hub id) and `revision` are what is loaded; `label`
    names it in files and figures; `step` is its training step (None if unknown) and `step_from` says where
    the step came from ('trainer_state.json', 'name' or None)."""

    label: str
    model: str
    revision: str | None
    step: int | None
    step_from: str | None


def parse_checkpoints(value: str | Sequence[str]) -> list[str]:
    """'a,b,c' or ['a', 'b', 'c'] -> the entries (empty ones refused)."""
    entries = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    entries = [e.strip() for e in entries]
    if not entries or not all(entries):
        raise PosprobeError(
            f"--checkpoints '{value}' has an empty entry",
            "give folders, .gguf files or ID@REVISION separated by commas, or one training run folder",
        )
    return entries


def list_checkpoints(entries: str | Sequence[str]) -> list[Checkpoint]:
    """The checkpoints of `entries` (see the module docstring), ordered by step when every one has a step."""
    found: list[Checkpoint] = []
    for entry in parse_checkpoints(entries):
        path = Path(entry).expanduser()
        if path.is_dir() and not (path / "config.json").is_file():
            inner = [p for p in path.glob("checkpoint-*") if p.is_dir()]
            if not inner:
                raise PosprobeError(
                    f"'{entry}' holds neither config.json nor checkpoint-* folders",
                    "pass model folders, .gguf files, ID@REVISION, or a training run folder with checkpoint-* folders",
                )
            found += [_folder_checkpoint(p) for p in sorted(inner, key=lambda p: p.name)]
        elif path.exists():
            found.append(_folder_checkpoint(path))
        elif "@" in entry:
            model, _, revision = entry.rpartition("@")
            match = _STEP_IN_NAME.search(revision)
            step = int(match.group(1)) if match else None
            found.append(Checkpoint(entry, model, revision, step, "name" if match else None))
        else:
            found.append(Checkpoint(entry, entry, None, None, None))
    if len(found) < 2:
        raise PosprobeError(
            f"a series needs at least 2 checkpoints, found {len(found)}",
            "pass several checkpoints separated by commas, or a run folder with several checkpoint-* folders",
        )
    found = _unique_labels(found)
    if all(c.step is not None for c in found):
        found.sort(key=lambda c: c.step)
    return found


def _folder_checkpoint(path: Path) -> Checkpoint:
    state = path / "trainer_state.json" if path.is_dir() else None
    if state is not None and state.is_file():
        try:
            step = json.loads(state.read_text(encoding="utf-8"))["global_step"]
            if not isinstance(step, int) or isinstance(step, bool):
                raise ValueError(f"global_step is {step!r}, not a whole number")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, OSError) as err:
            raise PosprobeError(
                f"cannot read the step from '{state}' ({type(err).__name__}: {first_line(err, 120)})",
                "repair or remove the file (the step is then read from the folder name)",
            ) from err
        return Checkpoint(path.name, str(path), None, step, "trainer_state.json")
    match = _STEP_IN_NAME.search(path.name)
    return Checkpoint(path.name, str(path), None, int(match.group(1)) if match else None, "name" if match else None)


def _unique_labels(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """Labels made unique by their parent folder where two checkpoints share a name."""
    from dataclasses import replace

    names = [c.label for c in checkpoints]
    out = []
    for c in checkpoints:
        if names.count(c.label) > 1 and c.revision is None:
            c = replace(c, label=f"{Path(c.model).parent.name}/{c.label}")
        out.append(c)
    labels = [c.label for c in out]
    if len(set(labels)) < len(labels):
        raise PosprobeError("two checkpoints of the series are the same", "pass each checkpoint once")
    return out


@dataclass(frozen=True, repr=False)
class StatesSeries(ResultMixin, Saves):
    """SPEC §16 for a series of checkpoints: `results[c]` is checkpoint c's `StatesResult`; `steps` (C,) their
    training steps (or 0..C-1 in the order given, when a step is unknown); `numbers[name]` (C, L+1) each
    per-hidden-state number (`states_result.PER_LAYER`) of every checkpoint."""

    title: str
    checkpoints: tuple[Checkpoint, ...]
    results: tuple[StatesResult, ...]
    seconds: float

    _repr_fields = ("title", "labels", "steps", "n_states")
    ARRAYS = {  # states_series.npz (formats.arrays); each checkpoint's states_<label>.npz: StatesResult.ARRAYS
        "steps": ("checkpoint",),
        "labels": ("checkpoint",),
        **{name: ("checkpoint", "state") for name in PER_LAYER},
    }

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.checkpoints]

    @property
    def ordered_by_step(self) -> bool:
        return all(c.step is not None for c in self.checkpoints)

    @property
    def steps(self) -> np.ndarray:
        if self.ordered_by_step:
            return np.array([c.step for c in self.checkpoints], dtype=np.int64)
        return np.arange(len(self.checkpoints), dtype=np.int64)

    @property
    def step_label(self) -> str:
        return "training step" if self.ordered_by_step else "checkpoint (in the order given)"

    @property
    def n_states(self) -> int:
        return self.results[0].n_states

    @property
    def numbers(self) -> dict[str, np.ndarray]:
        per = [r.per_layer() for r in self.results]
        return {name: np.stack([p[name] for p in per]) for name in PER_LAYER}

    def metadata(self) -> dict:
        first = self.results[0]
        return {
            "title": self.title,
            "checkpoints": [
                {"label": c.label, "model": c.model, "revision": c.revision, "step": c.step, "step_from": c.step_from}
                for c in self.checkpoints
            ],
            "ordered_by_step": self.ordered_by_step,
            "n_states": self.n_states,
            "n_texts": first.n_texts,
            "max_length": first.max_length,
            "text": first.text_source,
            "min_texts": first.vectors.min_texts,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        return {"steps": self.steps, "labels": np.array(self.labels)} | self.numbers

    def to_dict(self) -> dict:
        numbers = {name: [_nulls(row) for row in values] for name, values in self.numbers.items()}
        return self.metadata() | {"steps": self.steps.tolist()} | numbers | {"seconds": round(self.seconds, 3)}

    def record(self, npz=None, figures=None, checkpoint_npz=None) -> dict:
        """The CLI's `--json` record: `to_dict()` with the series `.npz`, the figure and each checkpoint's `.npz`."""
        out = {"npz": None if npz is None else str(npz)} | self.to_dict()
        if figures is not None:
            out["figures"] = [str(f) for f in figures]
        if checkpoint_npz is not None:
            out["checkpoint_npz"] = [str(p) for p in checkpoint_npz]
        return out

    def output_files(self, fmt: str) -> list[OutputFile]:
        """`states_series.npz`, `states_series.<fmt>` and each checkpoint's `states_<label>.npz` ('checkpoint_npz')."""
        from posprobe.formats.writing import slug
        from posprobe.plotting import states as plots

        files = [
            arrays_file("states_series.npz", self),
            figure_file(f"states_series.{fmt}", lambda: plots.series_chart(self)),
        ]
        for checkpoint, result in zip(self.checkpoints, self.results):
            files.append(arrays_file(f"states_{slug(checkpoint.label)}.npz", result, group="checkpoint_npz"))
        return files

    def plot(self):
        """Each number against the training step, one line per hidden state."""
        from posprobe.plotting import states as plots

        return plots.series_chart(self)


def states_series(
    checkpoints: str | Sequence[str],
    texts: Sequence[str] | Callable[[], Iterable[str]] | None = None,
    *,
    input_ids: Sequence[Sequence[int]] | None = None,
    title: str | None = None,
    progress: Callable[[int], None] | None = None,
    on_checkpoint: Callable[[Checkpoint], None] | None = None,
    **settings,
) -> StatesSeries:
    """`posprobe.states` of every checkpoint of `checkpoints` (see `list_checkpoints`) on the same texts: a list
    of strings, or a function returning a fresh iterable of them (a file read again per checkpoint); or
    `input_ids`. `settings` are `states`' keyword arguments (max_length, batch_size, min_texts, ...).
    `on_checkpoint(c)` is called before each checkpoint runs. All checkpoints must have the same depth."""
    from posprobe.pipelines.states import states

    if "revision" in settings:
        raise PosprobeError("a series takes its revisions from its entries", "write each entry as ID@REVISION")
    if texts is not None and not callable(texts) and iter(texts) is texts:
        raise PosprobeError(
            "a series reads the texts once per checkpoint, and an iterator can be read only once",
            "pass a list of texts, or a function that returns them",
        )
    items = list_checkpoints(checkpoints)
    started = time.perf_counter()
    results = []
    for item in items:
        if on_checkpoint is not None:
            on_checkpoint(item)
        run_texts = texts() if callable(texts) else texts
        result = states(
            item.model, run_texts, input_ids=input_ids, revision=item.revision, progress=progress, **settings
        )
        if results and result.n_states != results[0].n_states:
            raise PosprobeError(
                f"'{item.label}' has {result.n_layers} layers and '{items[0].label}' {results[0].n_layers}",
                "a series compares checkpoints of one model: pass checkpoints of the same architecture",
            )
        results.append(result)
    title = title or _common_title(items)
    return StatesSeries(title, tuple(items), tuple(results), time.perf_counter() - started)


def _common_title(items: list[Checkpoint]) -> str:
    parents = {str(Path(c.model).parent) if c.revision is None else c.model for c in items}
    return parents.pop() if len(parents) == 1 else f"{len(items)} checkpoints"


def write_series(series: StatesSeries, out_dir: str | Path, fmt: str = "png") -> dict:
    """Write `states_series.npz` (steps, labels, every number (C, L+1)), `states_series.<fmt>` and each checkpoint's
    full `states_<label>.npz` into `out_dir`, as one unit (`formats.save.save`). Returns the paths."""
    return save(series, out_dir, fmt)
