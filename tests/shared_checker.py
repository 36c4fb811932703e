"""The project's results checker, ``../shared/tools/check_results.py`` beside the checkout, for the papers' tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

CHECKER = Path(__file__).resolve().parents[2] / "shared" / "tools" / "check_results.py"


def check_results_file(path: str | Path) -> None:
    """Assert that the shared checker accepts the ``results.json`` at ``path`` (schema, kinds, CIs, guards and
    void claims, a verdict that follows from the checks); skip where the checker is not beside this checkout."""
    if not CHECKER.exists():
        pytest.skip(f"the shared checker is not beside this checkout ({CHECKER})")
    spec = importlib.util.spec_from_file_location("check_results", CHECKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    err = mod.check(str(path))
    assert err is None, f"{path}: {err}"
