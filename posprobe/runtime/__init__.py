"""How a run is carried out: ranks under torchrun (`distributed`) and the named phases of long work (`phases`)."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
