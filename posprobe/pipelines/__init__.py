"""Pipelines: join model access, pure analysis and output. One function per CLI command."""

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
