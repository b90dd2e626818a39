"""Retrofitting: install a mechanism (`install`), run its attention (`attention`), load any model (`loading`)."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
