"""A benchmark run says how long it takes and leaves its results on disk as it goes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.common import BenchRun, bench_arguments


def parsed(out: Path, *flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_arguments(parser)
    return parser.parse_args(["--out", str(out), *flags])


def test_the_expected_duration_comes_first_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    BenchRun("demo", parsed(tmp_path, "--quick"), minutes=(12, 1.5))
    err = capsys.readouterr().err
    assert err.startswith("bench.demo: quick run, about 1.5 min") and "full 12 min" in err


def test_each_section_is_on_disk_before_the_run_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stopped after its first section, a run has left that section in bench/out/<name>.json."""
    run = BenchRun("demo", parsed(tmp_path), minutes=(3, 1))
    run.section("turns", [{"turn": 1}])
    on_disk = json.loads((tmp_path / "demo.json").read_text())
    assert on_disk["complete"] is False and on_disk["turns"] == [{"turn": 1}]
    assert on_disk["options"]["quick"] is False
    run.section("turns", [{"turn": 1}, {"turn": 2}])
    run.finish(meets_target=True)
    on_disk = json.loads((tmp_path / "demo.json").read_text())
    assert on_disk["complete"] is True and len(on_disk["turns"]) == 2 and on_disk["meets_target"] is True
    assert json.loads(capsys.readouterr().out) == on_disk
    assert [p.name for p in tmp_path.iterdir()] == ["demo.json"]  # no temporary file left behind


def test_a_run_that_ends_short_of_its_figures_says_so_in_its_last_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The result is stdout's last line, and the keys a reader checks close it, `complete` last:
    false when the benchmark does not measure every figure yet, though the run ended."""
    run = BenchRun("demo", parsed(tmp_path), minutes=(3, 1))
    run.section("turns", [{"turn": 1}])
    run.finish(complete=False, ratio=2.5, missing_figure=None)
    last_line = capsys.readouterr().out.splitlines()[-1]
    printed = json.loads(last_line)
    assert list(printed)[-3:] == ["ratio", "missing_figure", "complete"] and printed["complete"] is False
    assert "elapsed_s" in printed and printed == json.loads((tmp_path / "demo.json").read_text())
