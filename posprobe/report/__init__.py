"""`posprobe report`: every analysis that applies to one model, run through its own command, on one offline page.

`build_report(model, ...)` (in `run`) runs the sections of `sections.SECTIONS` and writes `report.html` (`page`).
"""

from posprobe.report.run import build_report

__all__ = ["build_report"]

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
