"""`chatcache cluster`: three replicas on PostgreSQL behind HAProxy, one of them killed mid-load;
and the first `cluster up` on a fresh machine, where the replicas find the bundled model unconverted.

Real processes: `chatcache cluster up` starts PostgreSQL, three `chatcache serve` replicas on
the tiny model and HAProxy, all on loopback. Fifty conversations run at once through the
router; once each has been answered twice, the replica serving the first is killed with
SIGKILL while turns are in flight. A client whose request fails sends the same message again.
Every reply is then checked against the same conversation answered alone in this process,
without the answer cache: a reply that came from another session's KV or answer would differ.
A lighter test checks which spill key file `up` gives every replica.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatcache.cluster import free_port, replica_key_file
from chatcache.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONVERSATIONS = 50
TURNS = 4
MAX_TOKENS = 4

def _chatcache(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chatcache.cli", *args], env=env, capture_output=True, text=True, timeout=timeout)


def _alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (its parent, `cluster up`, exited long ago)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_replicas_are_given_one_key_file_kept_in_the_cluster_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replica must sign spilled KV with the same key: `up` passes one file to all of them,
    generated once beside the cluster's state (not in the spill dir) unless one is given."""
    directory = tmp_path / "cluster"
    generated = replica_key_file(directory, None)
    assert generated == (directory / "kv.key").resolve() and stat.S_IMODE(generated.stat().st_mode) == 0o600
    key = generated.read_text()
    assert replica_key_file(directory, None) == generated and generated.read_text() == key  # the next `up` keeps it
    given = tmp_path / "given.key"
    given.write_text("g" * 40 + "\n")
    assert replica_key_file(directory, given) == given.resolve()
    given.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 32"):
        replica_key_file(directory, given)
    monkeypatch.setenv("CHATCACHE_KV_KEY", "e" * 40)
    assert replica_key_file(directory, None) is None  # the replicas inherit the environment's key


def test_sessions_stay_on_their_replica_and_continue_on_another_when_it_is_killed(
    tmp_path: Path, tiny_model_dir: Path, tiny_model
) -> None:  # type: ignore[no-untyped-def]
    assert shutil.which("haproxy"), "HAProxy is not installed: `.ci/run` installs it (apt-get install haproxy)"
    env = {**os.environ, "CHATCACHE_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    started = _chatcache(env, "cluster", "up", "--replicas", "3", "--port", str(free_port()), "--model", str(tiny_model_dir), timeout=600)
    assert started.returncode == 0, started.stderr[-3000:]
    url = started.stdout.strip().splitlines()[-1]
    status = json.loads(_chatcache(env, "cluster", "status", "--json").stdout)
    try:
        assert status["url"] == url and status["database_url"].startswith("postgresql")
        assert [r["ready"] for r in status["replicas"]] == [True] * 3 and status["router"]["alive"]
        assert _chatcache(env, "cluster", "up", "--replicas", "1").returncode == 2, "a second cluster is refused"
        served_by: dict[int, list[tuple[float, str]]] = {i: [] for i in range(CONVERSATIONS)}
        acknowledged: dict[int, list[str]] = {i: [] for i in range(CONVERSATIONS)}
        replies: dict[int, list[str]] = {i: [] for i in range(CONVERSATIONS)}
        failed: dict[int, list[str]] = {i: [] for i in range(CONVERSATIONS)}
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        twice = threading.Barrier(CONVERSATIONS + 1)
        errors: list[BaseException] = []

        def converse(index: int) -> None:
            try:
                with httpx.Client(base_url=url, timeout=120) as http:
                    for turn in range(TURNS):
                        if turn == 2:
                            twice.wait()
                        text = f"conversation {index} turn {turn}"
                        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS}
                        for _ in range(60):
                            try:
                                answered = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": f"s{index}"})
                            except httpx.TransportError:
                                answered = None
                            if answered is not None and answered.status_code == 200:
                                break
                            failed[index].append(text)
                            time.sleep(0.5)
                        else:
                            raise AssertionError(f"conversation {index} turn {turn} was never answered: {answered and answered.text}")
                        acknowledged[index].append(text)
                        replies[index].append(answered.json()["choices"][0]["message"]["content"])
                        served_by[index].append((time.monotonic(), answered.headers["x-chatcache-replica"]))
            except BaseException as error:  # noqa: BLE001 - reported by the test thread
                errors.append(error)
                twice.abort()

        threads = [threading.Thread(target=converse, args=(i,)) for i in range(CONVERSATIONS)]
        for thread in threads:
            thread.start()
        try:
            twice.wait(timeout=300)
        except threading.BrokenBarrierError:
            for thread in threads:
                thread.join(timeout=60)
            raise AssertionError(f"a conversation failed before the kill: {errors}") from None
        victim_name = served_by[0][-1][1]
        victim = next(r for r in status["replicas"] if r["name"] == victim_name)
        os.kill(victim["pid"], signal.SIGKILL)  # the third turns are on their way
        killed_at = time.monotonic()
        for thread in threads:
            thread.join(timeout=300)
        assert not errors, errors

        # Affinity: before the kill every conversation stayed on one replica, and the load was spread.
        assert all(len({name for _, name in replicas[:2]}) == 1 for replicas in served_by.values()), served_by
        assert len({replicas[0][1] for replicas in served_by.values()}) > 1
        after = [name for replicas in served_by.values() for at, name in replicas if at > killed_at]
        assert after and victim_name not in after, "nothing was served by the dead replica after it died"
        moved = [replicas for replicas in served_by.values() if replicas[1][1] == victim_name]
        assert moved and all(replicas[-1][1] != victim_name for replicas in moved), "the victim's conversations went on elsewhere"
        # The record: every acknowledged turn once, answered, in order; other user messages only from failed attempts.
        with httpx.Client(base_url=url, timeout=60) as http:
            for index in range(CONVERSATIONS):
                messages: list[dict[str, Any]] = http.get(f"/v1/sessions/s{index}").json()["messages"]
                answered_texts = [
                    m["content"] for m, after in zip(messages, [*messages[1:], None]) if m["role"] == "user" and after and after["role"] == "assistant"
                ]
                assert answered_texts == acknowledged[index], (index, messages)
                unanswered = [m["content"] for m in messages if m["role"] == "user"]
                for text in answered_texts:
                    unanswered.remove(text)
                assert set(unanswered) <= set(failed[index]), (index, unanswered)
        _assert_each_reply_is_its_own_conversations(tiny_model, tmp_path, acknowledged, replies)
    finally:
        stopped = _chatcache(env, "cluster", "down", timeout=180)
    assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped", stopped.stderr
    pids = [status["router"]["pid"], *(r["pid"] for r in status["replicas"])]
    assert not any(_alive(pid) for pid in pids)
    assert json.loads(_chatcache(env, "cluster", "status", "--json").stdout) == {"up": False}


@pytest.mark.bundled
def test_the_first_cluster_up_on_a_fresh_machine_converts_the_bundled_model_once(tmp_path: Path) -> None:
    """A fresh XDG data home: the three replicas start on the bundled model together, one converts
    it while the others wait, and all three come up (they raced to convert it, and one died)."""
    assert shutil.which("haproxy"), "HAProxy is not installed: `.ci/run` installs it (apt-get install haproxy)"
    env = {key: value for key, value in os.environ.items() if key != "CHATCACHE_DATA_DIR"}
    env |= {"XDG_DATA_HOME": str(tmp_path / "xdg"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    started = _chatcache(env, "cluster", "up", "--replicas", "3", "--port", str(free_port()), timeout=600)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        url = started.stdout.strip().splitlines()[-1]
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200
    finally:
        stopped = _chatcache(env, "cluster", "down", timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    logs = sorted((tmp_path / "xdg" / "chatcache" / "cluster").glob("replica-*.log"))
    assert len(logs) == 3 and sum(log.read_text().count("converting SmolLM2") for log in logs) == 1


def _assert_each_reply_is_its_own_conversations(
    tiny_model, tmp_path: Path, acknowledged: dict[int, list[str]], replies: dict[int, list[str]]
) -> None:  # type: ignore[no-untyped-def]
    """Each conversation's acknowledged turns answered again alone, as a replica answers them
    (its system prompt, drift on the bundled embedder), with no answer cache: greedy replies must
    be the same, whichever replica, KV or cache served them."""
    from chatcache import ChatEngine
    from chatcache.serving.server import DEFAULT_SYSTEM_PROMPT

    alone = ChatEngine(tiny_model, system_prompt=DEFAULT_SYSTEM_PROMPT, drift=True, store=f"sqlite:///{tmp_path}/alone.db")
    for index in range(CONVERSATIONS):
        expected = [alone.chat(f"s{index}", text, max_new_tokens=MAX_TOKENS).text for text in acknowledged[index]]
        assert replies[index] == expected, (index, replies[index], expected)
    alone.close()


def test_cluster_up_gives_every_replica_the_answer_cache_bound(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The flags go into the options each replica's `serve` is started with; a bad value stops
    `up` before anything starts."""
    from chatcache import cli, cluster

    given: list[list[str]] = []

    def up(replicas: int, port: int, db: str | None, options: list[str], kv_key_file: Path | None) -> Any:
        given.append(options)
        raise RuntimeError("stopped here: the test only looks at the options")

    monkeypatch.setattr(cluster, "up", up)
    flags = ["--answer-cache-max-error-rate", "0.01", "--answer-cache-confidence", "0.9", "--answer-cache-audit-rate", "0.05"]
    assert cli.main(["cluster", "up", "--replicas", "3", *flags]) == 2
    assert given == [flags]
    assert cli.main(["cluster", "up", "--answer-cache-max-error-rate", "0.6"]) == 2
    assert len(given) == 1 and "max_error_rate is a share of served answers in (0, 0.5), got 0.6" in capsys.readouterr().err
