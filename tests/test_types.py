"""The package type-checks: mypy in strict mode, as pyproject.toml's [tool.mypy] configures it.

Run here so the README's test command (what CI runs) checks the types too. mypy keeps its
cache in `.mypy_cache` at the repository root: the first run analyses torch and transformers
(a minute or two), later runs only what changed (seconds).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_reports_no_errors() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"mypy (exit {result.returncode}):\n{result.stdout}{result.stderr}"
