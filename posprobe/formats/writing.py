"""Writing results: output folders checked before work starts, and every file written atomically.

A file appears under its final name only once it is complete (write to a temporary sibling, then
`os.replace`; several files of one result together through a staging folder, `write_files`), so an
interrupted or failed run never leaves a half-written file behind. The CLI brackets
each command with `begin_run()` / `discard_run()`: when a run fails, the files it wrote into folders it
created are removed, and so are those folders, so a failed run leaves no (empty) output folder.
A write that fails for lack of space or permission is one `PosprobeError`, never a raw `OSError`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posprobe.errors import PosprobeError, first_line
from posprobe.runtime.phases import phase

FIGURE_FORMATS = ("png", "pdf", "svg")
PHASE_EVERY = 2.0  # seconds: `write_files` names the file it writes at most this often (and always the first)


class _RunLog:
    """What the current CLI run created: folders (outermost first) and files, for `discard_run`."""

    def __init__(self) -> None:
        self.active = False
        self.folders: list[Path] = []
        self.files: list[Path] = []


_RUN = _RunLog()


def begin_run() -> None:
    """Start recording the folders and files this run creates (the CLI calls it once per command)."""
    _RUN.active, _RUN.folders, _RUN.files = True, [], []


def discard_run() -> None:
    """Undo a failed run: remove the files it wrote into folders it created, then those folders if empty.

    Files written into folders that existed before the run are complete (atomic) and are kept."""
    discard_unkept()
    _RUN.active = False


def discard_unkept() -> None:
    """Undo what the current run wrote since `keep_written` (a failed step of a run that goes on, `posprobe
    report`'s section, or the whole run): files in folders it created, then those folders if empty. The run keeps
    recording."""
    created = {folder.resolve() for folder in _RUN.folders}
    for file in _RUN.files:
        if any(parent in created for parent in file.resolve().parents):
            file.unlink(missing_ok=True)
    for folder in reversed(_RUN.folders):  # innermost first
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty (someone else's files) or already gone
    _RUN.folders, _RUN.files = [], []


def _make_dirs(path: Path) -> None:
    """`mkdir -p path`, recording every folder it creates (outermost first) for `discard_run`."""
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    for folder in missing:
        folder.mkdir(exist_ok=True)
        if _RUN.active:
            _RUN.folders.append(folder)


def _write_error(path: Path, err: OSError) -> PosprobeError:
    """One user-facing error for a failed write (full disk, no permission, read-only file system)."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free some disk space or choose another folder with --out"
    else:
        hint = "choose a writable folder with --out"
    return PosprobeError(f"cannot write '{path}' ({err.strerror or err})", hint)


def _writes() -> bool:
    """Whether this process writes: not a rank other than 0 of a data-parallel capture (SPEC §19: rank 0 alone
    writes; the others computed the same result and return the paths rank 0 writes)."""
    from posprobe.runtime.distributed import skips_writes

    return not skips_writes()


def prepare_out_dir(out: str | Path) -> Path:
    """Create `out` if needed and prove it is writable, before any expensive work starts.

    Folders created here are recorded: if the run then fails, `discard_run` removes them again."""
    path = Path(out).expanduser()
    if not _writes():
        return path
    try:
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "it is a file, not a folder")
        _make_dirs(path)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".posprobe-probe-"):
            pass
    except OSError as err:
        raise PosprobeError(
            f"cannot write to output folder '{path}' ({err.strerror or err})", "choose a writable folder with --out"
        ) from err
    return path


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_path)` and move the result to `path` only if it succeeded.

    A missing parent folder is created (and recorded for `discard_run`). An `OSError` (e.g. ENOSPC, a
    full disk) becomes a `PosprobeError`; either way no temporary or partial file is left behind."""
    path = Path(path)
    if not _writes():
        return path
    tmp_path: Path | None = None
    try:
        _make_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
        os.close(fd)
        tmp_path = Path(tmp)
        write(tmp_path)
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp_path, path)
    except OSError as err:
        if tmp_path is not None:
            tmp_path.unlink(missing_ok=True)
        raise _write_error(path, err) from err
    except BaseException:
        if tmp_path is not None:
            tmp_path.unlink(missing_ok=True)
        raise
    if _RUN.active:
        _RUN.files.append(path)
    return path


def write_files(out_dir: str | Path, files: dict[str, Callable[[Path], None]]) -> dict[str, Path]:
    """Write several files into `out_dir` as one unit: `files` maps each file name to `write(tmp_path)`; all are
    written into a hidden staging folder inside `out_dir` and moved into place only once every one succeeded.
    On failure (an error, Ctrl-C, a full disk) nothing new appears: the staging folder goes, and so does any
    folder this call created. Returns {name: final path}, in the order given."""
    out = Path(out_dir).expanduser()
    if not _writes():
        return {name: out / name for name in files}
    created = next((f for f in reversed((out, *out.parents)) if not f.exists()), None)  # outermost missing folder
    staging: Path | None = None
    try:
        _make_dirs(out)
        staging = Path(tempfile.mkdtemp(dir=out, prefix=".posprobe-staging-"))
        said = None
        for k, (name, write) in enumerate(files.items()):
            if said is None or time.monotonic() - said > PHASE_EVERY:  # figures take seconds each: say where it is
                phase(f"writing {name} ({k + 1} of {len(files)} files) into {out}")
                said = time.monotonic()
            write(staging / name)
            os.chmod(staging / name, 0o666 & ~_umask())
        for name in files:
            os.replace(staging / name, out / name)
    except BaseException as err:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if created is not None and not _RUN.active:  # a CLI run removes what it created in `discard_run`
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(err, OSError):
            raise _write_error(out, err) from err
        raise
    shutil.rmtree(staging, ignore_errors=True)
    paths = {name: out / name for name in files}
    if _RUN.active:
        _RUN.files.extend(paths.values())
    return paths


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def json_writer(obj: Any) -> Callable[[Path], None]:
    """A `write_files` writer of `obj` as indented JSON."""
    text = json.dumps(obj, indent=2, default=_json_default) + "\n"
    return lambda p: p.write_text(text)


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text))


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def _savefig(fig, path: Path, dpi: int = 110) -> None:  # keep dpi in step with plotting.FIGURE_DPI
    """Write a matplotlib Figure, or a `plotting.Mosaic` (its own `savefig`), in the format of `path`'s suffix."""
    fmt = path.suffix.lstrip(".")
    if not hasattr(fig, "get_axes"):  # a Mosaic: PNG through Pillow, PDF/SVG through matplotlib
        fig.savefig(path, format=fmt)
        return
    extra = {"pil_kwargs": {"compress_level": 3}} if fmt == "png" else {}  # zlib level 3: half the time of 6
    fig.savefig(path, format=fmt, dpi=dpi, **extra)


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib Figure or a `plotting.Mosaic` atomically (format from the suffix: png, pdf or svg)."""
    return atomic_write(path, lambda p: _savefig(fig, p, dpi))


def figure_writer(make_figure: Callable[[], Any]) -> Callable[[Path], None]:
    """A `write_files` writer that draws its figure (`make_figure()`) only when it is written."""
    return lambda p: _savefig(make_figure(), p)


def write_npz(path: Path, metadata: dict, **arrays) -> None:
    """Write arrays plus a JSON `metadata` entry to `path` as it is (a `write_files` / `atomic_write` writer;
    read back with `load_npz`). Results never call it: their `.npz` goes through `formats.arrays.write_arrays`,
    from their declared arrays."""
    import numpy as np

    with open(path, "wb") as fh:
        np.savez(fh, metadata=np.array(json.dumps(metadata, default=_json_default)), **arrays)


def save_npz(path: str | Path, metadata: dict, **arrays) -> Path:
    """`write_npz`, atomically."""
    return atomic_write(path, lambda p: write_npz(p, metadata, **arrays))


def load_npz(path: str | Path) -> tuple[dict, dict]:
    """Inverse of `write_npz`: (metadata dict, arrays). Never unpickles; a damaged, truncated or foreign file
    (not a zip, a member cut short, metadata that is not a JSON object) is one `PosprobeError`."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != "metadata"}
            metadata = json.loads(str(data["metadata"])) if "metadata" in data.files else {}
    except Exception as err:  # BadZipFile, EOFError, zlib.error, ValueError, OSError, ...: the file is damaged
        raise PosprobeError(
            f"cannot read '{path}' as a posprobe .npz file ({type(err).__name__}: {first_line(err, 200)})",
            "pass a file written by `posprobe profiles` (re-run it if the file was cut short)",
        ) from err
    if not isinstance(metadata, dict):
        raise PosprobeError(
            f"the metadata in '{path}' is a JSON {type(metadata).__name__}, not an object",
            "pass a file written by `posprobe profiles`",
        )
    return metadata, arrays


SLUG_MAX = 80
DEFAULT_OUT_ROOT = "posprobe-out"


def default_out(command: str, model_label: str) -> Path:
    """`posprobe-out/<command>/<model label>` (git-ignored): default outputs never touch tracked files."""
    return Path(DEFAULT_OUT_ROOT) / command / slug(model_label)


def slug(name: str) -> str:
    """A file-name-safe version of a model name ('bert-base-uncased', 'org/model' -> 'org--model').

    At most SLUG_MAX characters (a file name may hold 255 bytes): a longer one keeps its start and ends in a
    short hash of the whole name, so two long names that share a prefix still get two folders."""
    keep = "".join(c if c.isalnum() or c in "-_." else "-" for c in name.strip("/").replace("/", "--"))
    keep = keep.strip("-.") or "model"
    if len(keep) > SLUG_MAX:
        import hashlib

        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        keep = keep[: SLUG_MAX - len(digest) - 1].rstrip("-.") + "-" + digest
    return keep


def json_standard(obj: Any) -> Any:
    """`obj` with numpy values as Python ones, paths as strings, and every non-finite float (NaN, Infinity, which
    standard JSON has no word for) as None; dicts, lists and tuples walked."""
    import math

    import numpy as np

    if isinstance(obj, dict):
        return {k: json_standard(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_standard(v) for v in obj]
    if isinstance(obj, (np.ndarray, np.generic, Path)):
        return json_standard(_json_default(obj))
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _json_default(obj: Any):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def disk_full(err: BaseException) -> bool:
    """True for a full disk or quota, also where a library wraps the OSError in its own exception (torch's
    stream writer, safetensors' serialiser) and only its message or its cause says so."""
    seen = 0
    while err is not None and seen < 5:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(err)
        if "No space left on device" in text or "StorageFull" in text or "Disk quota exceeded" in text:
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def disk_full_error(err: BaseException, where: Path) -> PosprobeError:
    return PosprobeError(
        f"no space left on the device while writing to '{where}'",
        "free some disk space or choose another --out; nothing half-written was kept",
    )


def end_run() -> None:
    """The run is over (finished or failed and discarded): later writes in this process, e.g. library calls in the
    same Python session, again clean up after themselves."""
    _RUN.active, _RUN.folders, _RUN.files = False, [], []


def keep_written() -> None:
    """Keep what the current run has written so far, even if it fails later: `discard_run` then removes only what
    comes after (`posprobe report` calls it after each finished section, so that a re-run can reuse them)."""
    _RUN.files, _RUN.folders = [], []
