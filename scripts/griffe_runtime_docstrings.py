"""A griffe extension for the API page (mkdocs.yml): a docstring that the code completes when it is imported
(`fhat.__doc__ = fhat.__doc__.format(texts=...)` in posprobe/pipelines/weights.py) is shown as Python sees it, not
with its `{placeholder}`."""

from __future__ import annotations

import importlib
import inspect

import griffe


class RuntimeDocstrings(griffe.Extension):
    def on_function_instance(self, *, func, **kwargs) -> None:
        if func.docstring is None or "{" not in func.docstring.value:
            return
        module = importlib.import_module(func.module.path)
        runtime = inspect.getdoc(getattr(module, func.name, None))
        if runtime and "{" not in runtime.split("\n", 1)[0] and runtime != func.docstring.value:
            func.docstring.value = runtime
