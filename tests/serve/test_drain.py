"""SIGTERM drains the running turns, spills KV and closes the database; the next start continues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from chatcache.cluster import free_port



def start(model_dir: Path, db: str, data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CHATCACHE_DATA_DIR": str(data_dir), "CHATCACHE_ANSWER_CACHE": "false", "CHATCACHE_DRIFT": "false"}
    process = subprocess.Popen(
        [sys.executable, "-m", "chatcache.cli", "serve", "--model", str(model_dir), "--db", db, "--port", str(port), "--drain-seconds", "60"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {process.stdout.read().decode() if process.stdout else ''}")
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the server did not get ready")


def test_sigterm_finishes_the_running_turn_and_the_next_start_continues_from_disk(tiny_model_dir: Path, tmp_path: Path) -> None:
    db, data_dir, port = f"sqlite:///{tmp_path}/serve.db", tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    model = tiny_model_dir.name
    server = start(tiny_model_dir, db, data_dir, port)
    pieces: list[str] = []
    first_piece = threading.Event()

    def long_turn() -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me everything"}], "max_tokens": 300, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": "d"}, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    pieces.append(line[6:])
                    if len(pieces) > 2:
                        first_piece.set()

    reader = threading.Thread(target=long_turn)
    reader.start()
    try:
        assert first_piece.wait(60)
        server.send_signal(signal.SIGTERM)
        reader.join(120)
        assert server.wait(90) == 0, "a drained server exits 0"
    finally:
        if server.poll() is None:
            server.kill()
    output = server.stdout.read().decode(errors="replace") if server.stdout else ""
    assert "terminate called" not in output and "Traceback" not in output, output[-3000:]
    assert pieces[-1] == "[DONE]"  # the turn ran to its end although the server was stopping
    final = json.loads(pieces[-2])
    generated = final["chatcache"]["generated_tokens"]
    assert generated == 300 or final["choices"][0]["finish_reason"] == "stop"
    assert list((data_dir / "kv").glob("*.safetensors")), "the session's KV was spilled at shutdown"

    server = start(tiny_model_dir, db, data_dir, port)
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            messages = http.get("/v1/sessions/d").json()["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant"]
            body = {"model": model, "messages": [{"role": "user", "content": "Go on"}], "max_tokens": 4}
            after = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "d"}).json()
        assert after["chatcache"]["tier"] == "disk"
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] > generated  # the whole first turn came back
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(90) == 0
