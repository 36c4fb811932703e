"""Every ```python block of the READMEs runs as written (the API examples are real)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = [ROOT / "README.md", *sorted((ROOT / "src" / "icml24").glob("*/README.md"))]
BLOCKS = [(p, i, code) for p in READMES
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", p.read_text(encoding="utf-8"), re.S))]


@pytest.mark.parametrize("path, index, code", BLOCKS, ids=[f"{p.parent.name}-{i}" for p, i, _ in BLOCKS])
def test_readme_example_runs(path, index, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{path}:python-block-{index}", "exec"), {"__name__": "__readme__"})


def test_ci_runs_the_readmes_test_command_verbatim():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"Run the tests:\n\n```\n(.*?)\n```", readme, re.S).group(1)
    assert command.endswith("pytest")
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
