"""The keys that sign spilled KV, and where they come from.

A spill directory may be shared by replicas (a network filesystem, an object-store mount), so
whoever can write to it can alter a file and recompute any checksum the file carries. A spill
file is therefore trusted only when its HMAC-SHA256 verifies under a key that the spill
directory never holds (`kv_spill`).

Keys come from the first of these that gives any:

1. `TokenTierConfig.spill_keys`, or a key file (`TokenTierConfig.spill_key_file`,
   `chatcache serve --kv-key-file`, `chatcache cluster up --kv-key-file`);
2. `CHATCACHE_KV_KEY`, plus `CHATCACHE_KV_PREVIOUS_KEY` while a rotation is under way;
3. `kv.key` in the data directory, generated on first use. This is enough on one machine,
   where every process shares the data directory.

Keys are newest first: the first signs, and every key verifies. To rotate, put the new key first
and keep the old one second until the files it signed have been restored (a restored session's
next spill is signed with the new key) or have aged out of the disk budget; then drop it. A key
file holds one key a line, newest first. A key is its UTF-8 text and must be at least
`MIN_KEY_BYTES` long; a generated key is 64 hex digits (256 random bits).

This module does not share keys between machines. Replicas get the same key through their
configuration (`chatcache cluster up` generates one in its state directory and passes it to
every replica), never through the spill directory.

It lies outside `tiers/`, below the settings: `TokenTierConfig` loads the keys when it is
made, so that a bad key fails there.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from chatcache.storage import default_data_dir

from .errors import ConfigError
from .first_run import produce_once

log = logging.getLogger("chatcache")
KEY_ENV = "CHATCACHE_KV_KEY"
PREVIOUS_KEY_ENV = "CHATCACHE_KV_PREVIOUS_KEY"
GENERATED_KEY_FILE = "kv.key"  # in the data directory, beside (never inside) the default spill dir `kv/`
MIN_KEY_BYTES = 32  # HMAC-SHA256's own output size: a shorter key is easier to guess than the MAC
GENERATED_KEY_BYTES = 32


def load_spill_keys(spill_dir: Path, key_file: Path | None) -> tuple[bytes, ...]:
    """The keys of `key_file`, else of the environment, else of the data directory's generated key file.

    Raises:
        ConfigError: a key is too short, a key file is unreadable, empty, or lies in `spill_dir`
            (whoever writes spill files there could read it).
    """
    if key_file is None:
        if (keys := environment_keys()) is not None:
            return keys
        key_file = generate_key_file(default_data_dir() / GENERATED_KEY_FILE)
    if key_file.expanduser().resolve().parent == spill_dir.expanduser().resolve():
        raise ConfigError(
            f"The spill key file {key_file} is in the spill directory: whoever can write spill files could "
            "read it. Keep it elsewhere (the data directory, or a secrets mount)."
        )
    return read_key_file(key_file)


def environment_keys() -> tuple[bytes, ...] | None:
    """The keys `CHATCACHE_KV_KEY` and `CHATCACHE_KV_PREVIOUS_KEY` give; None when neither is set.

    Raises:
        ConfigError: a key is too short, or the previous key is set without the new one.
    """
    if os.environ.get(KEY_ENV):
        keys = [os.environ[KEY_ENV], *([os.environ[PREVIOUS_KEY_ENV]] if os.environ.get(PREVIOUS_KEY_ENV) else [])]
        return check_keys(tuple(key.strip().encode() for key in keys), KEY_ENV)
    if os.environ.get(PREVIOUS_KEY_ENV):
        raise ConfigError(f"{PREVIOUS_KEY_ENV} is set without {KEY_ENV}: set the new key in {KEY_ENV}.")
    return None


def read_key_file(path: Path) -> tuple[bytes, ...]:
    """The keys in `path`, one a line, newest first (blank lines skipped).

    Raises:
        ConfigError: the file is unreadable, holds no key, or a key is too short.
    """
    try:
        text = path.expanduser().read_text(encoding="utf-8")
        mode = path.expanduser().stat().st_mode
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"Cannot read the spill key file {path}: {error}") from None
    if mode & 0o077:
        log.warning("The spill key file %s can be read by other users (mode %o): chmod 600 it.", path, mode & 0o777)
    keys = tuple(line.strip().encode() for line in text.splitlines() if line.strip())
    if not keys:
        raise ConfigError(f"The spill key file {path} holds no key.")
    return check_keys(keys, str(path))


def check_keys(keys: Sequence[bytes], source: str) -> tuple[bytes, ...]:
    """`keys` as a tuple, once each is bytes of at least `MIN_KEY_BYTES` (never naming a key itself).

    Raises:
        ConfigError: a key is not bytes or is too short.
    """
    for number, key in enumerate(keys, 1):
        if not isinstance(key, bytes):
            raise ConfigError(f"Spill key {number} of {source} must be bytes, got {type(key).__name__}.")
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(
                f"Spill key {number} of {source} is {len(key)} bytes; a key signing spilled KV needs at least "
                f"{MIN_KEY_BYTES} (make one with: python -c 'import secrets; print(secrets.token_hex(32))')."
            )
    return tuple(keys)


def generate_key_file(path: Path) -> Path:
    """`path`, first given a new random key if it does not exist, readable by its owner alone.

    Made once however many processes start at once (`produce_once`): every one of them reads
    the same key, and none ever reads a key file half written.
    """
    return produce_once(path, Path.exists, _write_new_key)


def _write_new_key(path: Path) -> None:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
        handle.write(secrets.token_hex(GENERATED_KEY_BYTES) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
