"""What `chatcache serve` is told: flags, then environment (`CHATCACHE_*`), then a config file.

Every setting is validated before the model loads, so a typo in a port or a key file fails at
once with the setting's name, not minutes later or under the first request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from ..config import check_compiled_decode, check_spill_keys
from .keys import ApiKeys


class ServeSettings(BaseSettings):
    """The server's settings; flags override the environment, which overrides the config file.

    Attributes:
        bot: a bot definition (YAML path or shipped bot name); none for a plain chatbot.
        model: "bundled", a Hugging Face model id or a local path (not a remote server's address:
            admission control predicts each turn from the model's own step times).
        precision: the model's products: "exact" (default) or "int8" (`load_chat_model`).
        compiled_decode: decode with the step compiled by inductor (`load_chat_model`'s
            `compiled_decode`), compiled before the first request; exact precision only.
        db: SQLAlchemy URL of the session database (default: SQLite in the data directory).
        kv_dir: where cold sessions' KV is spilled (default: `kv` in the data directory);
            replicas on several machines share it on a network filesystem or an object-store mount.
        kv_key_file: the keys that sign spilled KV, one a line, newest first (`TokenTierConfig.spill_keys`);
            replicas sharing a kv_dir need the same file. Default: `CHATCACHE_KV_KEY`, else a key
            generated into the data directory. Never inside kv_dir.
        host, port: where to listen; loopback by default.
        system_prompt: the bot's instructions (default: the bot's, or a generic one).
        ttft_slo: refuse (429) a request predicted to wait longer than this for its first token.
        max_queue: refuse (429) a request when this many are admitted and waiting for their first token.
        api_key_file: one `KEY TENANT [ROLE]` per line (ROLE `customer`, the default, or `agent`); with keys (here or in `api_keys`) every request needs one.
        api_keys: the same lines in the environment (`CHATCACHE_API_KEYS`), separated by `;` or newlines.
        rate_limit: requests per second each API key may send (a token bucket); none for no limit.
        rate_burst: requests a key may send at once before its rate applies.
        busy_session: a session's second message while its turn runs: wait behind it, or 409.
        max_body_bytes: larger request bodies get 413.
        drain_seconds: on SIGTERM, how long running turns may take to finish.
        max_tokens: reply tokens when a request does not say.
        answer_cache, drift: the engine's answer cache and drift detection.
        answer_cache_max_error_rate: the share of answers the answer cache serves by meaning
            that may be wrong (`AnswerCacheConfig.max_error_rate`); none: its fixed thresholds.
        answer_cache_confidence: how sure that bound is (`AnswerCacheConfig.bound_confidence`).
        answer_cache_audit_rate: the share of hits the model answers again to check them
            (`AnswerCacheConfig.audit_rate`); 0 leaves the bound unwatched on live questions.
    """

    model_config = SettingsConfigDict(env_prefix="CHATCACHE_", extra="forbid", validate_default=True)

    bot: str | None = None
    model: str = "bundled"
    precision: Literal["exact", "int8"] = "exact"
    compiled_decode: bool = False
    db: str | None = None
    kv_dir: Path | None = None
    kv_key_file: Path | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    system_prompt: str | None = None
    ttft_slo: float | None = Field(None, gt=0)
    max_queue: int = Field(64, ge=1)
    api_key_file: Path | None = None
    api_keys: str | None = None
    rate_limit: float | None = Field(None, gt=0)
    rate_burst: int = Field(10, ge=1)
    busy_session: Literal["wait", "reject"] = "wait"
    max_body_bytes: int = Field(1_000_000, ge=1024)
    drain_seconds: float = Field(30.0, ge=0)
    max_tokens: int = Field(256, ge=1)
    answer_cache: bool = True
    answer_cache_max_error_rate: float | None = Field(None, gt=0, lt=0.5)
    answer_cache_confidence: float = Field(0.95, ge=0.5, lt=1)
    answer_cache_audit_rate: float = Field(0.0, ge=0, le=1)
    drift: bool = True

    @field_validator("model")
    @classmethod
    def _local(cls, model: str) -> str:
        if model.startswith(("http://", "https://")):
            raise ValueError(
                "chatcache serve runs a local model: its admission control predicts each turn from the "
                "model's own step times. A model served elsewhere works from Python and `chatcache chat --model URL`."
            )
        return model

    @field_validator("api_key_file", "kv_key_file")
    @classmethod
    def _readable(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"{path} is not a readable file")
        return path

    @model_validator(mode="after")
    def _compiled_decode_exact(self) -> ServeSettings:
        """int8 with a compiled step fails here, before the model loads (`check_compiled_decode`)."""
        check_compiled_decode(self.precision, self.compiled_decode)
        return self

    @model_validator(mode="after")
    def _spill_keys_usable(self) -> ServeSettings:
        """A short or missing spill key fails now, not once the model has loaded."""
        check_spill_keys(self.kv_key_file)
        return self

    def keys(self) -> ApiKeys:
        """The API keys of the key file and the environment, checked line by line."""
        keys = ApiKeys()
        if self.api_key_file is not None:
            keys.add_lines(self.api_key_file.read_text(encoding="utf-8").splitlines(), str(self.api_key_file))
        if self.api_keys:
            keys.add_lines(self.api_keys.replace(";", "\n").splitlines(), "CHATCACHE_API_KEYS")
        return keys

    @classmethod
    def load(cls, config_file: Path | None = None, **flags: Any) -> ServeSettings:
        """Settings from the given flags (None means unset), the environment and `config_file` (YAML)."""
        given = {name: value for name, value in flags.items() if value is not None}
        if config_file is None:
            return cls(**given)
        if not config_file.is_file():
            raise ValueError(f"config file {config_file} is not a readable file")
        from_file = type("ServeSettingsFromFile", (cls,), {"model_config": {**cls.model_config, "yaml_file": config_file}})
        return from_file(**given)  # type: ignore[no-any-return]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No .env or secrets directory is read: only what the operator passes or exports, and the
        # config file (`model_config["yaml_file"]`, set by `load`; none by default).
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls)
