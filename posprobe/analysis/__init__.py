"""Pure analysis: numpy arrays in, arrays or frozen dataclasses out. No torch, typer, rich or matplotlib."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
