"""One place for each command's defaults (`posprobe.pipelines.defaults`): every option of the commands that `posprobe
report` runs shows, as its default, what the pipeline function the command calls takes by default; the report passes
only what a section's command line names, so it runs with these same values. The numbers are written out here (the
documented defaults), so that a change is a deliberate one."""

from __future__ import annotations

import inspect

import pytest


def default(function, name: str):
    value = inspect.signature(function).parameters[name].default
    return getattr(value, "value", value)  # an Enum option (--mode): its value


def numbers(text: str, kind=int) -> list:
    return [kind(part) for part in text.split(",")]


def test_context_options_are_the_pipelines_defaults():
    from posprobe.cli.context import context as command
    from posprobe.pipelines.context import check_lengths, context

    assert numbers(default(command, "lengths")) == check_lengths(None) == [512, 1024, 2048]
    assert default(command, "text") == "builtin:kjv"
    for option, value in (("windows", 4), ("rope_scaling", "none"), ("batch_size", 1)):
        assert default(command, option) == default(context, option) == value, option


def test_needle_options_are_the_pipelines_defaults():
    from posprobe.cli.needle import needle as command
    from posprobe.pipelines.needle import NeedleGrid, needle
    from posprobe.pipelines.needle_prompts import NeedleTask

    grid, task = NeedleGrid(), NeedleTask()
    assert numbers(default(command, "lengths")) == list(grid.lengths) == [256, 512, 1024]
    assert numbers(default(command, "depths"), float) == list(grid.depths) == [0, 0.25, 0.5, 0.75, 1]
    assert default(command, "trials") == grid.trials == 3
    assert default(command, "seed") == grid.seed == 0
    assert default(command, "digits") == task.digits == 5
    assert default(command, "haystack") == default(needle, "haystack") == "builtin:kjv"
    assert default(needle, "model") == "SmolLM2-135M-Instruct"


def test_states_and_attention_options_are_the_pipelines_defaults():
    from posprobe.cli.attention import attention as attention_command
    from posprobe.cli.states import states as states_command
    from posprobe.pipelines.attention import attention_profiles, write_attention
    from posprobe.pipelines.states import states

    for option, value in (("min_texts", 16), ("mae_sample", 2048), ("seed", 0), ("null_draws", 8), ("controls", 5)):
        assert default(states_command, option) == default(states, option) == value, option
    assert default(attention_command, "min_pairs") == default(attention_profiles, "min_pairs") == 100
    assert default(attention_command, "window") == default(write_attention, "window") == 20
    assert default(attention_command, "text") == default(states_command, "text") == "builtin:sentences"


@pytest.mark.parametrize("command", ["fhat", "profiles"])
def test_weight_options_are_the_pipelines_defaults(command):
    from posprobe.cli import text_input
    from posprobe.cli import weights as cli
    from posprobe.pipelines import weights

    assert default(getattr(cli, command), "mode") == default(getattr(weights, command), "mode") == "paper"
    assert default(getattr(weights, command), "min_texts") == 16
    assert "(default 16)" in str(text_input.MinTextsOpt.__metadata__[0].help)
    if command == "fhat":
        assert default(cli.fhat, "layer") == default(weights.fhat, "layer") == 0
    else:
        assert default(cli.profiles, "layers") == "all" and default(weights.profiles, "layers") is None


def test_fit_tisa_and_rotary_options_are_the_pipelines_defaults():
    from posprobe.cli.fitting import fit_tisa as fit_command
    from posprobe.cli.rotary import rotary as rotary_command
    from posprobe.pipelines.fitting import fit_tisa
    from posprobe.pipelines.rotary import rotary

    assert numbers(default(fit_command, "kernels")) == list(default(fit_tisa, "kernels")) == [5]
    for option, value in (("mode", "paper"), ("seed", 0), ("orientation", "posprobe")):
        assert default(fit_command, option) == default(fit_tisa, option) == value, option
    assert default(fit_command, "layers") == default(rotary_command, "layers") == "all"
    assert default(fit_tisa, "layers") is None and default(rotary, "layers") is None
    assert default(rotary_command, "rope_scaling") == default(rotary, "rope_scaling") == "none"


def test_the_report_names_no_default_of_its_own():
    """`report.library` passes what a section names and nothing else: no number or text of a command's defaults
    written in it (they are read from `pipelines.defaults`)."""
    import ast
    from pathlib import Path

    import posprobe.report.library as library

    tree = ast.parse(Path(library.__file__).read_text())
    constants = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and not isinstance(n.value, bool)}
    for value in ("builtin:kjv", "builtin:sentences", "paper", "none", "all", 2048, 16, 20, 5, 4, 3, 8):
        assert value not in constants, value


def test_the_defaults_module_loads_no_analysis_and_agrees_with_it():
    """defaults.py imports nothing (so every command and `--help` read it without scipy or torch), and its states
    values are the constants the analyses use."""
    import subprocess
    import sys

    heavy = "('scipy', 'torch', 'posprobe.analysis')"
    code = f"import sys, posprobe.pipelines.defaults; print(sorted(m for m in sys.modules if m.startswith({heavy})))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
    from posprobe.analysis.position_probe import DEFAULT_SAMPLE, N_CONTROLS
    from posprobe.analysis.positional_vectors import DEFAULT_MIN_TEXTS, NULL_DRAWS
    from posprobe.pipelines import defaults

    assert (defaults.MIN_TEXTS, defaults.STATES_MAE_SAMPLE, defaults.STATES_NULL_DRAWS, defaults.STATES_CONTROLS) == (
        DEFAULT_MIN_TEXTS,
        DEFAULT_SAMPLE,
        NULL_DRAWS,
        N_CONTROLS,
    )
