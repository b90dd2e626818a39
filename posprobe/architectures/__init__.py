"""What each model type is, from its config alone: the family table (`table`), config fields and sizes (`config`)."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
