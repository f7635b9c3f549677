"""The package keeps its layers: import-linter's contracts, as pyproject.toml's [tool.importlinter] declares them.

Run here so the README's test command (what CI runs) checks the layers too, as test_types.py
checks the types: a module that imports a layer above its own (and so could close a cycle
between subpackages), or a linked folder by its top-level name (`import dialog`), fails this
test with import-linter's report of the import chain. It reads the source and imports nothing
of it, so it takes about a second.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `lint-imports`, run by the interpreter running the tests; from ROOT, which it puts first on
# sys.path, so it reads this checkout's chatcache whatever else is installed.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"import-linter (exit {result.returncode}):\n{result.stdout}{result.stderr}"


def test_every_module_and_subpackage_of_chatcache_has_a_layer() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    package = ROOT / "chatcache"
    present = {f"chatcache.{path.stem}" for path in package.glob("*.py") if path.stem != "__init__"}
    present |= {f"chatcache.{path.name}" for path in package.iterdir() if (path / "__init__.py").is_file()}
    assert present - placed == set(), "a new module or subpackage of chatcache: give it a layer in pyproject.toml"
