"""posprobe's version: the one place it is written (pyproject.toml reads it from here)."""

__version__ = "0.1.0"

# The transformers release posprobe is tested with (constraints/tested.txt pins it, a test checks both agree): its
# model types are the ones the family table answers for; a model type only a newer release has is refused in one line
TESTED_TRANSFORMERS = "5.25.0"
