"""Hub dataset splits: `load_hub_dataset` reads one through `datasets`, quietly, and refuses at once (one line) when
the hub cannot be reached and the split is not in the local cache. Used by text sources (`hub:NAME`) and GLUE."""

from __future__ import annotations

import contextlib
import os
import socket

from posprobe.errors import PosprobeError


def load_hub_dataset(name: str, config: str | None, split: str | None, what: str, hint: str):
    """`datasets.load_dataset(name, config, split=split)`, quiet; offline (`hub_offline_reason`) it reads the
    local cache only, at once. Any failure is one PosprobeError naming `what` (e.g. "GLUE 'cola'") and `hint`."""
    try:
        import datasets
    except ImportError:
        raise PosprobeError(f"loading {what} from the hub needs the `datasets` package", hint) from None
    offline = hub_offline_reason()
    try:
        with _datasets_offline(offline is not None), _quiet_datasets():
            return datasets.load_dataset(name, config, split=split)
    except Exception as err:  # offline, DNS, missing cache, hub errors, unknown split: all mean "no data this way"
        if offline is not None:
            raise PosprobeError(
                f"could not load {what} from the Hugging Face hub: it is not in the local datasets cache "
                f"and the hub cannot be used ({offline})",
                hint,
            ) from err
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise PosprobeError(f"could not load {what} from the Hugging Face hub ({reason})", hint) from err


def hub_offline_reason(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached, decided at once, or None when it can: offline mode set in the
    environment (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE), or one TCP connection to the
    hub's endpoint that fails within `timeout` seconds (instead of `datasets`' retries with back-off)."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{name} is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return None  # the hub is reached through a proxy: a direct connection proves nothing
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"no connection to {host}: {err.strerror or type(err).__name__}"
    return None


@contextlib.contextmanager
def _datasets_offline(offline: bool):
    """Run `datasets` in offline mode (cache only, no retries) for the block, whatever the environment said
    when it was imported."""
    if not offline:
        yield
        return
    import datasets.config
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = saved[0]
        constants.HF_HUB_OFFLINE = saved[1]


@contextlib.contextmanager
def _quiet_datasets():
    """No `datasets` warnings or progress bars on the console while loading."""
    import datasets

    verbosity = datasets.logging.get_verbosity()
    bars = datasets.utils.is_progress_bar_enabled()
    datasets.logging.set_verbosity_error()
    datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.utils.enable_progress_bars()
