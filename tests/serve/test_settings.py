"""`chatcache serve` settings: flags over environment over the config file, checked before the model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from chatcache.cli import main
from chatcache.serving import ServeSettings
from chatcache.serving.keys import OPEN_CALLER, Caller, KeyFileError, TokenBucket


def test_flags_override_the_environment_which_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("port: 9001\nttft_slo: 4\nmax_queue: 7\n")
    monkeypatch.setenv("CHATCACHE_TTFT_SLO", "2.5")
    settings = ServeSettings.load(config, port=9100, max_queue=None)
    assert (settings.port, settings.ttft_slo, settings.max_queue) == (9100, 2.5, 7)


@pytest.mark.parametrize(("text", "field"), [("port: 99999\n", "port"), ("ttft_slo: -1\n", "ttft_slo"), ("prot: 1\n", "prot")])
def test_a_bad_setting_in_the_file_names_itself(tmp_path: Path, text: str, field: str) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(text)
    with pytest.raises(ValidationError, match=field):
        ServeSettings.load(config)


def test_key_lines_map_keys_to_tenants_and_bad_lines_say_where(tmp_path: Path) -> None:
    keys = ServeSettings(api_keys="key-for-acme-0000001 acme;key-for-globex-00001 globex").keys()
    assert keys.required and keys.tenants == {"acme", "globex"}
    assert keys.caller_of("key-for-acme-0000001") == Caller("acme", "customer")
    assert keys.caller_of("key-for-acme-0000002") is None and keys.caller_of(None) is None
    assert ServeSettings().keys().caller_of(None) == OPEN_CALLER  # no keys: one open tenant, whose callers may also act as agents
    path = tmp_path / "keys.txt"
    for text, problem in (
        ("# comment\nkey-for-acme-0000001 acme agent sam extra\n", "line 2: expected 'KEY TENANT \\[ROLE \\[NAME\\]\\]'"),
        ("short acme\n", "at least 16"),
        ("key-for-acme-0000001 acme/evil\n", "tenant 'acme/evil'"),
        ("key-for-acme-0000001 a\nkey-for-acme-0000001 b\n", "line 2: this key is already given"),
    ):
        path.write_text(text)
        with pytest.raises(KeyFileError, match=problem):
            ServeSettings(api_key_file=path).keys()


def test_a_token_bucket_lets_a_burst_through_then_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("chatcache.serving.keys.time.monotonic", lambda: now[0])
    bucket = TokenBucket(rate=2.0, burst=3)
    assert [bucket.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take("k") == pytest.approx(0.5) and bucket.take("other") == 0.0
    now[0] += 0.5
    assert bucket.take("k") == 0.0


def test_serve_refuses_bad_settings_before_loading_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    assert "port" in capsys.readouterr().err
    keys = tmp_path / "keys.txt"
    keys.write_text("too short\n")
    assert main(["serve", "--api-key-file", str(keys)]) == 2
    assert "line 1" in capsys.readouterr().err
    assert main(["serve", "--api-key-file", str(tmp_path / "missing.txt")]) == 2
    assert "not a readable file" in capsys.readouterr().err


def test_serve_refuses_a_bad_kv_key_file_before_loading_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "kv.key"
    keys.write_text("too short\n")
    assert main(["serve", "--kv-key-file", str(keys)]) == 2
    assert "at least 32" in capsys.readouterr().err
    assert main(["serve", "--kv-key-file", str(tmp_path / "missing.key")]) == 2
    assert "not a readable file" in capsys.readouterr().err


def test_serve_refuses_a_bad_kv_key_in_the_environment_before_loading_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHATCACHE_KV_KEY", "too short")
    assert main(["serve"]) == 2
    assert "at least 32" in capsys.readouterr().err
    monkeypatch.delenv("CHATCACHE_KV_KEY")
    monkeypatch.setenv("CHATCACHE_KV_PREVIOUS_KEY", "x" * 40)
    assert main(["serve"]) == 2
    assert "without CHATCACHE_KV_KEY" in capsys.readouterr().err


def test_compiled_decode_is_a_setting_refused_with_int8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`compiled_decode` comes from the flag, the environment or the file, off by default; with
    int8 the server refuses to start, naming the setting, before the model loads."""
    config = tmp_path / "serve.yaml"
    config.write_text("compiled_decode: true\n")
    assert ServeSettings.load(config).compiled_decode and not ServeSettings.load().compiled_decode
    assert ServeSettings.load(compiled_decode=True).compiled_decode
    monkeypatch.setenv("CHATCACHE_COMPILED_DECODE", "1")
    assert ServeSettings.load().compiled_decode
    with pytest.raises(ValidationError, match="compiled_decode"):
        ServeSettings.load(config, precision="int8")
    monkeypatch.delenv("CHATCACHE_COMPILED_DECODE")
    assert main(["serve", "--precision", "int8", "--compiled-decode"]) == 2
    assert "is for the exact precision, not int8" in capsys.readouterr().err


def test_serve_refuses_a_remote_model_before_loading_anything(capsys: pytest.CaptureFixture[str]) -> None:
    """A server's admission control predicts from the model's own steps: it needs the model here."""
    assert main(["serve", "--model", "http://127.0.0.1:8080/v1"]) == 2
    assert "runs a local model" in capsys.readouterr().err


def test_spilled_kv_goes_to_the_kv_dir(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`--kv-dir` puts what a draining server spills where other replicas can restore it, apart
    from the data directory."""
    shared = tmp_path / "shared-kv"
    live = serve(kv_dir=shared)
    with live.client() as http:
        body = {"model": live.model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        assert http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "kv-1"}).status_code == 200
    live.stop()
    assert [p.suffix for p in shared.iterdir()] == [".safetensors"]


def test_spilled_kv_is_signed_with_the_kv_key_file(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`--kv-key-file` gives the key every replica on a shared kv dir signs with, not the one
    generated in this server's data directory."""
    from safetensors import safe_open

    from chatcache.tiers.kv_spill import _key_id

    shared, key_file = tmp_path / "shared-kv", tmp_path / "kv.key"
    key = b"replica-key-0123456749abcdef0123456749"
    key_file.write_text(key.decode() + "\n")
    key_file.chmod(0o600)
    live = serve(kv_dir=shared, kv_key_file=key_file)
    with live.client() as http:
        body = {"model": live.model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        assert http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "kv-1"}).status_code == 200
    live.stop()
    [spilled] = shared.iterdir()
    with safe_open(str(spilled), framework="pt") as handle:
        assert (handle.metadata() or {})["key"] == _key_id(key)


def test_the_answer_cache_bound_comes_from_flags_or_the_environment_and_bad_values_name_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHATCACHE_ANSWER_CACHE_MAX_ERROR_RATE", "0.02")
    monkeypatch.setenv("CHATCACHE_ANSWER_CACHE_AUDIT_RATE", "0.05")
    settings = ServeSettings.load(None, answer_cache_confidence=0.9)
    assert (settings.answer_cache_max_error_rate, settings.answer_cache_confidence, settings.answer_cache_audit_rate) == (0.02, 0.9, 0.05)
    assert ServeSettings.load(None, answer_cache_max_error_rate=0.01).answer_cache_max_error_rate == 0.01
    monkeypatch.delenv("CHATCACHE_ANSWER_CACHE_MAX_ERROR_RATE")
    assert ServeSettings().answer_cache_max_error_rate is None  # no bound unless asked for
    for field, value in (
        ("answer_cache_max_error_rate", 0.0), ("answer_cache_max_error_rate", 0.5), ("answer_cache_confidence", 1.0),
        ("answer_cache_confidence", 0.4), ("answer_cache_audit_rate", 1.5),
    ):  # fmt: skip
        with pytest.raises(ValidationError, match=field):
            ServeSettings(**{field: value})


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--answer-cache-max-error-rate", "0.7"], "answer_cache_max_error_rate"),
        (["--answer-cache-max-error-rate", "0.01", "--answer-cache-confidence", "1"], "answer_cache_confidence"),
        (["--answer-cache-audit-rate", "-0.1"], "answer_cache_audit_rate"),
    ],
)
def test_serve_refuses_a_bad_answer_cache_bound_before_loading_anything(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import chatcache.serving

    monkeypatch.setattr(chatcache.serving, "create_app", lambda *a, **k: pytest.fail("the model would load"))
    assert main(["serve", *flags]) == 2
    assert named in capsys.readouterr().err


def test_serve_gives_every_engine_the_bound_it_was_told(serve) -> None:  # type: ignore[no-untyped-def]
    live = serve(answer_cache_max_error_rate=0.01, answer_cache_confidence=0.9, answer_cache_audit_rate=0.25)
    config = live.app.state.server.tenants("default").answer_cache.config
    assert (config.max_error_rate, config.bound_confidence, config.audit_rate) == (0.01, 0.9, 0.25)
