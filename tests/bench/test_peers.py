"""The benchmark talks to a peer's driver over pipes: ready, a job, its figures, a clear error, an end.

A fake driver on this interpreter stands in for vLLM and llama.cpp (their venvs are not needed):
it speaks the drivers' protocol (bench/peer_protocol.py) and makes up its turns.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.peer_protocol import Turn, figures, percentile
from bench.peers import PeerError, PeerProcess, start_peers, unavailable

BENCH = Path(__file__).resolve().parents[2] / "bench"

FAKE_DRIVER = f"""
import sys, time
sys.path.insert(0, {str(BENCH)!r})
import peer_protocol

out = peer_protocol.protocol_stdout()
print("a library that prints on stdout must not break the protocol")

def run_job(job):
    if job["max_new_tokens"] == 0:
        raise ValueError("no tokens asked for")
    if job["max_new_tokens"] < 0:
        sys.exit(3)
    turns = [peer_protocol.Turn(0.1, 0.1 + 0.01 * (job["max_new_tokens"] - 1), job["max_new_tokens"], 1000)
             for conversation in job["conversations"] for _ in conversation]
    return peer_protocol.figures(len(job["conversations"]), turns, 2.0)

peer_protocol.serve(out, {{"name": "fake", "version": "0", "settings": {{}}, "serial": False}}, run_job)
"""


@pytest.fixture
def fake_peer(tmp_path: Path) -> Iterator[PeerProcess]:
    driver = tmp_path / "peer_fake.py"
    driver.write_text(textwrap.dedent(FAKE_DRIVER))
    peer = PeerProcess("fake", "model", log_path=tmp_path / "peer_fake.log", python=Path(sys.executable), driver=driver)
    yield peer
    peer.close()


def test_a_job_comes_back_with_the_figures_bench_concurrency_reports(fake_peer: PeerProcess) -> None:
    assert fake_peer.peer["name"] == "fake"
    result = fake_peer.run("system", [["a", "b"], ["c", "d"]], max_new_tokens=16)
    assert result["conversations"] == 2 and result["turns"] == 4 and result["generated_tokens"] == 64
    assert result["tokens_per_s"] == 32.0 and result["ttft_p50_ms"] == 100.0
    assert result["time_per_output_token_p50_ms"] == 10.0 and result["peer"]["version"] == "0"
    assert fake_peer.run("system", [["a"]], max_new_tokens=8)["generated_tokens"] == 8  # the driver lives on


def test_a_failed_job_raises_with_the_reason_and_the_peer_goes_on(fake_peer: PeerProcess) -> None:
    with pytest.raises(PeerError, match="ValueError: no tokens asked for"):
        fake_peer.run("system", [["a"]], max_new_tokens=0)
    assert fake_peer.run("system", [["a"]], max_new_tokens=4)["turns"] == 1


def test_a_driver_that_dies_is_reported_with_the_end_of_its_log(fake_peer: PeerProcess) -> None:
    with pytest.raises(PeerError, match="exited with status 3(.|\n)*must not break the protocol"):
        fake_peer.run("system", [["a"]], max_new_tokens=-1)


def test_a_missing_venv_says_to_run_make_peers(tmp_path: Path) -> None:
    assert "run `make peers`" in (unavailable("vllm", venvs=tmp_path) or "")
    assert "unknown peer" in (unavailable("other", venvs=tmp_path) or "")
    with pytest.raises(PeerError, match="make peers"):
        PeerProcess("vllm", "model", python=tmp_path / "vllm" / "bin" / "python")


def test_start_peers_records_why_a_peer_did_not_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.peers.unavailable", lambda name: f"{name}: run `make peers`")

    class Tokenizer:
        name_or_path = str(tmp_path)

    peers, missing = start_peers(Tokenizer(), tmp_path)
    assert peers == {} and missing == {"vllm": "vllm: run `make peers`", "llamacpp": "llamacpp: run `make peers`"}


def test_percentiles_match_numpy_and_time_per_token_excludes_the_first() -> None:
    values = [5.0, 1.0, 9.0, 2.0, 7.5]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    turns = [Turn(ttft_s=0.5, total_s=1.5, generated_tokens=11, prompt_tokens=100, cached_tokens=90)]
    result = figures(1, turns, wall_s=2.0)
    assert result["time_per_output_token_p50_ms"] == 100.0 and result["prompt_share_cached"] == 0.9
