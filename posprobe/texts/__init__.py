"""Texts to run a model on: files, columns and builtin texts (`reading`), hub dataset splits (`hub`)."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
