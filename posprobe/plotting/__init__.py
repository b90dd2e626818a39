"""Figures drawn from results (matplotlib Figures, or a Mosaic of matrix panels); `base` has what all share."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
