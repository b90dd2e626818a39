"""posprobe: measure, fit and retrofit positional mechanisms in pretrained transformers.

Library entry points (imported lazily so that `import posprobe` stays light):
- `posprobe.pipelines.analysis`: `toeplitz_analysis`, `fhat_analysis`, `compute_profiles`, `compare_models`
- `posprobe.load_model(path_or_id)`: a (possibly retrofitted) model, ready to run
"""

__version__ = "0.1.0"


def load_model(*args, **kwargs):
    """Load a plain or retrofitted checkpoint with its positional mechanism installed (see posprobe.retrofit)."""
    from posprobe.retrofit import load_model as _load_model

    return _load_model(*args, **kwargs)
