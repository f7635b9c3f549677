"""The wheel stands alone: built from this checkout, installed into a fresh virtualenv in a
temporary directory, it trains the shipped bank bot's intent model, runs its conversation tests and answers a customer,
from a working directory outside the repository, with nothing of the checkout in reach.

The new virtualenv gets the wheel and only the wheel (`--no-deps`); its third-party
dependencies are the test's own interpreter's, seen through a path file. Why not install them
too: torch and transformers alone are gigabytes and minutes of a CI run, and what can go
missing from a wheel is our own files (data, YAML, templates), which come from the wheel only.
A plain path in a `.pth` file adds that directory to `sys.path` without running the `.pth`
files inside it, so the checkout's editable install stays out: the test asserts that
`chatcache` and `chatcache.dialog` are imported from the new virtualenv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from chatcache.apps.bank import demo_account_number

REPO = Path(__file__).resolve().parents[2]


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    """`command`'s output; its output is in the failure message when it fails."""
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh virtualenv holding the wheel of this checkout, and the environment to run it in."""
    root = tmp_path_factory.mktemp("wheel")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", "BANKING77_TRAIN")}
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(root / "dist"), str(REPO)], root, env)
    (wheel,) = (root / "dist").glob("chatcache-*.whl")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)], root, env)
    python = venv / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root, env).strip()
    (Path(site) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)], root, env)
    home = root / "home"  # the data directory and the demo bank of a new user
    env |= {"HF_HUB_OFFLINE": "1", "CHATCACHE_DATA_DIR": str(home / "data"), "CHATCACHE_BANK_DB": f"sqlite:///{home}/bank.sqlite"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    home.mkdir()
    return home, env


@pytest.mark.packaging
def test_the_wheel_claims_one_top_level_name_beside_other_distributions_generic_ones(installed: tuple[Path, dict[str, str]]) -> None:
    home, env = installed
    top_level = run(["python", "-c", "from importlib.metadata import distribution; print(distribution('chatcache').read_text('top_level.txt'))"], home, env)
    assert top_level.split() == ["chatcache"]
    other = home.parent / "other"  # another distribution's modules named as the repository's folders are
    for name in ("dialog", "storage", "apps"):
        (other / name).mkdir(parents=True)
        (other / name / "__init__.py").write_text(f"OWNER = 'other {name}'\n")
    both = {**env, "PYTHONPATH": str(other)}
    check = "import dialog, storage, apps; from chatcache.dialog import load_bot; print(dialog.OWNER, storage.OWNER, apps.OWNER, load_bot('bank').intents[0].name)"
    assert run(["python", "-c", check], home, both).split()[:6] == ["other", "dialog", "other", "storage", "other", "apps"]


@pytest.mark.bundled
@pytest.mark.packaging
def test_the_installed_wheel_runs_the_bank_bot_outside_the_checkout(installed: tuple[Path, dict[str, str]]) -> None:
    home, env = installed
    where = run(["python", "-c", "from chatcache import apps, dialog, storage; print(apps.__file__, dialog.__file__, storage.__file__)"], home, env)
    assert all(str(REPO) not in path and "/venv/" in path for path in where.split()), where
    # From the examples the wheel ships: about 9 minutes on 2 quiet cores, and as long again per job
    # sharing them, so its limit only catches a hang.
    assert "Trained:" in run(["chatcache", "train", "bank"], home, env, timeout=3600)
    stories = json.loads(run(["chatcache", "test-bot", "bank", "--json"], home, env))
    assert stories["total"] >= 30 and stories["passed"] == stories["total"], [s for s in stories["stories"] if not s["passed"]]
    new_bank = {**env, "CHATCACHE_BANK_DB": f"sqlite:///{home}/asked.sqlite"}  # the stories moved the other one's money
    reply = json.loads(run(["chatcache", "ask", "--bot", "bank", "--session", "s1", "--json", "What's my balance?"], home, new_bank))
    told = subprocess.run(["chatcache", "ask", "--bot", "bank", "--session", "s2", "Hello"], cwd=home, env=new_bank, capture_output=True, text=True, timeout=900)
    assert "read by the model trained on this bot's examples" in told.stderr, told.stderr[-4000:]  # said at start
    assert reply["intent"] == "check_balance" and reply["reply"] == f"Your balance is 2,500.00 EUR (account {demo_account_number('local')})."
