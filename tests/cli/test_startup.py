"""What a newcomer meets first: `chatcache bots`, a wrong --bot, a wrong --model, all without waiting."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from chatcache import cli

REPO = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], env: dict[str, str], probe: str = "") -> subprocess.CompletedProcess[str]:
    """`chatcache ARGS` in a fresh interpreter (nothing imported yet); `probe` runs after it, printing JSON."""
    code = (
        "import json, sys\n"
        "from chatcache.cli import main\n"
        f"code = main({args!r})\n"
        f"{probe or 'pass'}\n"
        "sys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300
    )


def test_bots_lists_the_shipped_bots(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bots"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("bank: 85 intents (check_balance, make_transfer,") and lines[0].endswith(" and 77 more)")
    assert lines[1].startswith("customer_service: 5 intents (") and "transfer_money" in lines[1] and "--bot" in lines[2]


def test_a_wrong_bot_fails_before_anything_loads_and_names_the_shipped_bots(tmp_path: Path) -> None:
    """`--bot banking`: exit 2 with one line naming customer_service and `chatcache bots`; the
    model loader is never reached (torch is not even imported) and there is no traceback."""
    env = {**os.environ, "CHATCACHE_DATA_DIR": str(tmp_path)}
    probe = "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))"
    done = run_cli(["ask", "--bot", "banking", "--session", "s", "hello"], env, probe)
    assert done.returncode == 2
    assert json.loads(done.stdout) == {"torch": False, "transformers": False}
    assert "Traceback" not in done.stderr
    assert "no bot 'banking'" in done.stderr and "customer_service" in done.stderr and "chatcache bots" in done.stderr


def test_a_wrong_model_fails_at_once_offline_unless_the_user_says_otherwise(tmp_path: Path) -> None:
    """With HF_HUB_OFFLINE unset, a model id that is not here gives the clear message without a
    single request to the hub (HF_ENDPOINT points at a socket that would see it)."""
    hub = socket.socket()
    hub.bind(("127.0.0.1", 0))
    hub.listen(8)
    hub.setblocking(False)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(CHATCACHE_DATA_DIR=str(tmp_path), HF_ENDPOINT=f"http://127.0.0.1:{hub.getsockname()[1]}")
    probe = "import huggingface_hub.constants as c; print(json.dumps({'offline': c.HF_HUB_OFFLINE}))"
    try:
        done = run_cli(["ask", "--model", "no-such-org/no-such-model", "--session", "s", "hello"], env, probe)
        with pytest.raises(BlockingIOError):
            hub.accept()  # nobody called
    finally:
        hub.close()
    assert done.returncode == 2
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"offline": True}
    assert "No chat model named 'no-such-org/no-such-model'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("0", "0"), ("1", "1")])
def test_the_offline_default_leaves_a_users_choice_alone(given: str | None, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if given is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", given)
    cli._offline_by_default()  # private: the step `main` takes first, alone, in this process's environment
    assert os.environ["HF_HUB_OFFLINE"] == expected


def test_a_bad_max_error_rate_fails_before_the_model_loads(tmp_path: Path) -> None:
    """`ask --max-error-rate 0.7`: exit 2 with one line saying what the rate must be; torch is never imported."""
    env = {**os.environ, "CHATCACHE_DATA_DIR": str(tmp_path)}
    probe = "print(json.dumps({'torch': 'torch' in sys.modules}))"
    done = run_cli(["ask", "--max-error-rate", "0.7", "--session", "s", "hello"], env, probe)
    assert done.returncode == 2
    assert json.loads(done.stdout) == {"torch": False}
    assert "max_error_rate is a share of served answers in (0, 0.5), got 0.7" in done.stderr and "Traceback" not in done.stderr


def test_max_error_rate_and_no_answer_cache_contradict_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["chat", "--no-answer-cache", "--max-error-rate", "0.01"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_max_error_rate_sets_the_engines_answer_cache_bound() -> None:
    from chatcache import AnswerCacheConfig

    # Private: what `main` builds the engine's answer cache from, without loading a model to see it.
    parse = cli._parser().parse_args
    assert cli._answer_cache(parse(["ask", "--max-error-rate", "0.01", "--session", "s", "x"])) == AnswerCacheConfig(max_error_rate=0.01)
    assert cli._answer_cache(parse(["ask", "--session", "s", "x"])) is True
    assert cli._answer_cache(parse(["chat", "--no-answer-cache"])) is False


def test_compiled_decode_reaches_the_model_loader(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--compiled-decode` on chat and ask loads the model with its decode step compiled; without
    it, eager. chat, ask and serve say what it does in their help."""
    import chatcache

    loaded: list[dict[str, object]] = []
    monkeypatch.setattr(chatcache, "load_chat_model", lambda name, **options: loaded.append(options))
    parse = cli._parser().parse_args
    cli._engine_factory(parse(["ask", "--compiled-decode", "--session", "s", "x"]))
    cli._engine_factory(parse(["chat", "--compiled-decode"]))
    cli._engine_factory(parse(["chat"]))
    assert [options["compiled_decode"] for options in loaded] == [True, True, False]
    for command in ("chat", "ask", "serve"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert "--compiled-decode" in capsys.readouterr().out


def test_compiled_decode_is_refused_with_int8_and_with_a_remote_model(capsys: pytest.CaptureFixture[str]) -> None:
    """Each fails with one line saying why, before a model loads or a server is reached."""
    assert cli.main(["ask", "--precision", "int8", "--compiled-decode", "--session", "s", "hello"]) == 2
    err = capsys.readouterr().err
    assert "compiled_decode (--compiled-decode) is for the exact precision, not int8" in err and "Traceback" not in err
    assert cli.main(["ask", "--model", "http://127.0.0.1:9/v1", "--compiled-decode", "--session", "s", "hello"]) == 2
    assert "a model served elsewhere decodes on its server" in capsys.readouterr().err
