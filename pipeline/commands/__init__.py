"""The command line and what only it uses: the dry-run estimate, translating a stream, showing
reports. `read_recipe` and `plan_recipe` bind the engine to the registered stages."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def read_recipe(path: str | Path, overrides: Sequence[str] = ()):
    """The recipe at `path`, with `overrides`, validated against the registered stages' sections."""
    from ..engine.recipe import load_recipe
    from ..stages import Recipe

    return load_recipe(path, list(overrides), Recipe)


def plan_recipe(path: str | Path, overrides: Sequence[str] = ()):
    """The recipe read and planned by the registered stages (pipeline/stages)."""
    from ..engine.runner import make_plan
    from ..stages import STAGES, Recipe

    return make_plan(path, list(overrides), STAGES, Recipe)
