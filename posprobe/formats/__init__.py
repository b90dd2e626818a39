"""File formats: atomic writes (`writing`), the save path (`save`), TISA kernels (`tisa_kernels`), profile files."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
