"""Artefacts made on first use (the converted bundled model, the weight digests) are made once.

Processes that start together on a fresh data directory (cluster replicas, `chatcache ask` in
parallel, test workers) each find the artefact missing: one makes it under a lock, the others
wait and use it. A producer that dies leaves no half-made artefact behind, only leftovers the
next producer removes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from chatcache.first_run import produce_once

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 3

# Waits for the start file after the imports, so the loads begin together, as replicas' do.
_LOAD_BUNDLED = textwrap.dedent(
    """
    import logging, sys, time
    from pathlib import Path
    from chatcache import load_chat_model
    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    Path(sys.argv[1]).touch()
    while not Path(sys.argv[2]).exists():
        time.sleep(0.01)
    print(load_chat_model("bundled", device="cpu").identity)
    """
)


@pytest.mark.bundled
def test_processes_that_load_the_bundled_model_at_once_convert_it_once(tmp_path: Path) -> None:
    """Three processes on a fresh XDG data home: all load the same weights, converted by one of them."""
    env = {key: value for key, value in os.environ.items() if key != "CHATCACHE_DATA_DIR"}
    env |= {"XDG_DATA_HOME": str(tmp_path / "xdg"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    results = _run_together(tmp_path, env, [[_LOAD_BUNDLED]] * PROCESSES)
    assert sum(err.count("converting SmolLM2") for _, err in results) == 1, [err for _, err in results]
    assert len({out for out, _ in results}) == 1, "every process loaded the same weights"
    models = tmp_path / "xdg" / "chatcache" / "models"
    assert sorted(path.name for path in models.iterdir()) == ["smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q4_1.lock"]


def _run_together(tmp_path: Path, env: dict[str, str], commands: list[list[str]]) -> list[tuple[str, str]]:
    """Run each `python -c SCRIPT ARGS...` at once: every script signals it imported what it needs
    (argv[1]) and waits for the start (argv[2]). Returns each one's stdout and stderr; all must exit 0."""
    go = tmp_path / "go"
    ready = [tmp_path / f"imported-{index}" for index in range(len(commands))]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(imported), str(go), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for imported, (script, *args) in zip(ready, commands)
    ]
    deadline = time.monotonic() + 60
    while not all(path.exists() for path in ready):
        assert all(child.poll() is None for child in children), [child.communicate() for child in children]
        assert time.monotonic() < deadline, "the processes did not import chatcache within 60 s"
        time.sleep(0.05)
    go.touch()
    results = [child.communicate(timeout=180) for child in children]
    assert [child.returncode for child in children] == [0] * len(children), [err[-3000:] for _, err in results]
    return [(out.strip(), err) for out, err in results]


_DIGEST = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from chatcache.model.weights_identity import weight_digests
    Path(sys.argv[1]).touch()
    while not Path(sys.argv[2]).exists():
        time.sleep(0.01)
    print(json.dumps(weight_digests([Path(name) for name in sys.argv[3:]])))
    """
)


def test_processes_that_hash_weights_at_once_keep_each_others_digests(tmp_path: Path) -> None:
    """Each process records a file of its own and a shared one in the one record: none is lost."""
    import hashlib
    import json

    shared = tmp_path / "shared.safetensors"
    shared.write_bytes(os.urandom(16 << 20))
    own = [tmp_path / f"own-{index}.safetensors" for index in range(PROCESSES)]
    for path in own:
        path.write_bytes(os.urandom(16 << 20))
    env = {**os.environ, "CHATCACHE_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    results = _run_together(tmp_path, env, [[_DIGEST, str(shared), str(path)] for path in own])
    expected = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in [shared, *own]}
    for path, (output, _) in zip(own, results):
        assert json.loads(output) == {name: expected[name] for name in (shared.name, path.name)}
    record = json.loads((tmp_path / "data" / "weights-digests.json").read_text())
    assert {Path(name).name: entry["sha256"] for name, entry in record.items()} == expected


def test_threads_that_ask_at_once_wait_for_one_producer(tmp_path: Path) -> None:
    target = tmp_path / "artefact"
    made: list[int] = []

    def produce(staging: Path) -> None:
        made.append(threading.get_ident())
        time.sleep(0.2)  # long enough that every other thread arrives while this one works
        staging.write_text("made")

    threads = [threading.Thread(target=produce_once, args=(target, Path.exists, produce)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and target.read_text() == "made"


def test_a_failed_producer_leaves_no_artefact_and_its_leftovers_go_on_the_next_run(tmp_path: Path) -> None:
    target = tmp_path / "models" / "converted"

    def fail_halfway(staging: Path) -> None:
        staging.mkdir()
        (staging / "weights.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        produce_once(target, Path.exists, fail_halfway)
    assert not target.exists()
    # A producer killed outright cleans up nothing: its staging directory stays until the next run.
    leftover = target.parent / f".{target.name}.killed.staging"
    (leftover / target.name).mkdir(parents=True)

    def produce(staging: Path) -> None:
        staging.mkdir()
        (staging / "weights.safetensors").write_bytes(b"whole")

    assert produce_once(target, Path.exists, produce) == target
    assert (target / "weights.safetensors").read_bytes() == b"whole"
    assert sorted(path.name for path in target.parent.iterdir()) == ["converted", "converted.lock"]


def test_a_stale_artefact_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "converted"
    target.mkdir()
    (target / "source").write_text("old package")

    def produce(staging: Path) -> None:
        staging.mkdir()
        (staging / "source").write_text("new package")

    def is_current(path: Path) -> bool:
        return path.joinpath("source").is_file() and path.joinpath("source").read_text() == "new package"

    produce_once(target, is_current, produce)
    assert [path.name for path in target.iterdir()] == ["source"] and is_current(target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["converted", "converted.lock"]
