"""A real llama.cpp server on loopback (`llama-cpp-python[server]`), serving the bundled GGUF.

chatcache's remote-model tests and `bench.remote` run an engine against it. The server runs in
`.venv-peers/llamacpp` (`make peers`, `make test`), or under the python that
`CHATCACHE_LLAMA_PYTHON` names. Its log is the only place it states what its prompt cache
reused: `Llama` prints "Llama.generate: N prefix-match hit" when a request's tokens start with N
tokens of the previous request's (it keeps one sequence), and the server's access log has one
line per request; `LlamaServer` reads both off its log.

    with LlamaServer.start(log_path) as server:
        engine = ChatEngine(server.url, ...)
        mark = server.mark()
        engine.chat(...)
        served = server.requests_since(mark)   # [ServedRequest(status, reused_tokens, prompt_tokens)]
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bench.peers import peer_python
from chatcache.cluster import HOST, free_port
from chatcache.model.loading import bundled_gguf

READY_TIMEOUT_S = 120.0
CONTEXT = 4096
_REQUEST = re.compile(r'"POST /v1/chat/completions HTTP/1\.1" (\d+)')
_PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")


def llama_python() -> Path:
    """The python that has llama-cpp-python's server."""
    configured = os.environ.get("CHATCACHE_LLAMA_PYTHON")
    return Path(configured) if configured else peer_python("llamacpp")


@dataclass
class ServedRequest:
    """One chat completion as the server's log tells it: its HTTP status, the prompt tokens its
    cache reused (the longest prefix shared with the request before it) and, when it reused
    any, the prompt tokens it had in all (its BOS token included)."""

    status: int
    reused_tokens: int = 0
    prompt_tokens: int | None = None


class LlamaServer:
    """A running llama.cpp server; stopped on `close` or leaving its `with` block."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    @classmethod
    def start(cls, log: Path, port: int | None = None, context: int = CONTEXT, threads: int = 2) -> LlamaServer:
        """Start one on `port` (a free one by default) and wait until it lists its model.

        Raises:
            RuntimeError: no llama-cpp-python server to start, or it did not come up (its log's tail says why).
        """
        python = llama_python()
        if not python.is_file():
            raise RuntimeError(
                f"No llama.cpp server: {python} does not exist. `make peers` (or `make test`) builds it, "
                "or set CHATCACHE_LLAMA_PYTHON to a python with llama-cpp-python[server]."
            )
        port = port or free_port()
        command = [
            str(python), "-m", "llama_cpp.server", "--model", str(bundled_gguf()), "--host", HOST,
            "--port", str(port), "--n_ctx", str(context), "--n_threads", str(threads), "--verbose", "true",
        ]  # fmt: skip
        with log.open("ab") as sink:
            process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        server = cls(process, f"http://{HOST}:{port}/v1", log)
        server._wait_ready()
        return server

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        self.close()
        tail = self.log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError("The llama.cpp server did not start:\n" + "\n".join(tail))

    def mark(self) -> int:
        """Where its log ends now: `requests_since` reads from there."""
        return self.log.stat().st_size

    def requests_since(self, mark: int) -> list[ServedRequest]:
        """The chat completions it served since `mark`, oldest first.

        A request's access line comes first (a streamed answer starts before the prompt is
        evaluated), then its prefix-match line if it reused anything. Only requests sent one at
        a time can be told apart this way.
        """
        with self.log.open("rb") as text:
            text.seek(mark)
            lines = text.read().decode(errors="replace").splitlines()
        served: list[ServedRequest] = []
        for line in lines:
            if request := _REQUEST.search(line):
                served.append(ServedRequest(int(request.group(1))))
            elif (hit := _PREFIX_HIT.search(line)) and served:
                served[-1].reused_tokens = int(hit.group(1))
                served[-1].prompt_tokens = int(hit.group(1)) + int(hit.group(2))
        return served

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()
