"""Cold sessions on disk: one safetensors file per session, signed, and checked before it is trusted.

A file records the ids its KV covers, the model and template identity, and an HMAC-SHA256
signature over its tensors (each one's name, dtype, shape and bytes), its metadata and the id of
the session it was written for. Signing uses a key the spill directory never holds
(`spill_keys`): the directory may be shared, and whoever can write to it could alter a file and
recompute any checksum stored beside the data. A checksum finds accidents; only a keyed
signature finds forgeries, and a valid file of one session copied over another's name too.
Anything off (truncated, corrupted, forged, signed with a key this store does not hold, written
for another session, other weights or another template) makes `load` return None. The refusal
is logged and counted (`rejected`), and the turn recomputes the KV from the conversation: a
spilled file can make a turn slower, never wrong. Optionally KV is stored as int8 with one scale
per (layer, head, position), about 3.9x smaller on float32 models and not bit-exact on restore.
Never pickle: a cache file must not be able to run code.

The first key signs and every key verifies, so files signed with the previous key are restored
during a rotation. A restored file is deleted, so the session's next spill is signed with the
current key. Files of the unsigned format "chatcache-kv/1" (only a SHA-256 beside the data) are
refused: they cost one recompute each after an upgrade.

A file is written under a temporary name and renamed into place, so a reader never sees half
of one. A write that fails (full disk, file size limit, read-only directory) raises `OSError`
and leaves nothing behind; one cut short by a kill leaves its temporary file, which the next
store to open the directory deletes. The writer holds an advisory lock on its temporary file,
so a live writer's file (another thread or process on the same directory) is never taken for
a leftover; while temporary files exist they count against the disk budget.

Admission control asks for a spilled session's ids on the event loop, for every request, so
the store remembers the ids of the files it wrote or read, keyed by the file's inode, size and
mtime: a file replaced since (by another process on the same directory) is read again. They are
kept as 4-byte ids within a byte bound (a list of Python ints takes 36 bytes an id), so that
thousands of spilled sessions cost a few MiB, not hundreds. Those ids are read without checking
the signature: a forged one can only skew an estimate, while `load` checks before any KV is used.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
import re
import sys
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from cachetools import LRUCache
from safetensors.torch import load_file, save

log = logging.getLogger("chatcache")
FORMAT = "chatcache-kv/2"  # signed; "chatcache-kv/1" carried only a SHA-256 and is refused
UNSIGNED_FORMAT = "chatcache-kv/1"
# Temporary names: ours (`<file>.tmp<pid>.<thread>`), and safetensors' own `.tmpXXXXXX`, which
# earlier versions left when killed while `save_file` wrote.
TEMPORARY = re.compile(r"[0-9a-f]{32}\.tmp\d+\.\d+|\.tmp[A-Za-z0-9]{6}")
KNOWN_IDS_BYTES = 8 << 20  # the remembered ids of spill files, about two million tokens


def _known_size(known: tuple[tuple[int, int, int], array[int]]) -> int:
    return sys.getsizeof(known[1])


@dataclass(frozen=True)
class SpilledKV:
    """What a spill file restores: the ids its KV covers and the per-layer keys and values."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def _key_id(key: bytes) -> str:
    """Which key signed a file, without revealing it: a MAC of a fixed text under that key."""
    return hmac.new(key, b"chatcache spill key id", hashlib.sha256).hexdigest()[:16]


def _signature(key: bytes, session_id: str, metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> str:
    """HMAC-SHA256 of all that a restore relies on: the session the file is for, every metadata
    entry (format, identity, template, dtype, ...) and each tensor's name, dtype, shape and bytes.
    Each part is length-prefixed, so no two different files sign the same byte string."""
    mac = hmac.new(key, digestmod=hashlib.sha256)

    def add(part: bytes | memoryview) -> None:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)

    add(session_id.encode())
    for name in sorted(metadata):
        add(name.encode())
        add(metadata[name].encode())
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        add(name.encode())
        add(f"{tensor.dtype} {tuple(tensor.shape)}".encode())
        add(tensor.view(torch.uint8).numpy().data.cast("B"))  # the bytes in place, not a copy
    return mac.hexdigest()


def _version(path: Path) -> tuple[int, int, int]:
    """What changes whenever a spill file is replaced or rewritten: its inode, size and mtime."""
    info = path.stat()
    return info.st_ino, info.st_size, info.st_mtime_ns


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per vector along the last (head) dimension."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale.to(torch.float32)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.to(torch.float32) * scale).to(dtype)


class SpillStore:
    """Session KV files in a directory, within a byte budget (least recently written go first),
    signed with the first of `keys` and restored when any of them verifies (newest first)."""

    def __init__(
        self, directory: Path, identity: str, template_hash: str, int8: bool, budget_bytes: int, keys: Sequence[bytes]
    ) -> None:
        self.directory = directory
        self.identity = identity
        self.template_hash = template_hash
        self.int8 = int8
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self.rejected = 0  # files found unusable and deleted
        self._signing_key = keys[0]
        self._keys = {_key_id(key): key for key in reversed(keys)}  # by id; the newest wins a collision
        # By file name: the file's version, and the ids its KV covers.
        self._known_ids: LRUCache[str, tuple[tuple[int, int, int], array[int]]] = LRUCache(
            KNOWN_IDS_BYTES, getsizeof=_known_size
        )
        self._known_ids_lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()

    def path(self, session_id: str) -> Path:
        # Session ids are user text: hash them into a safe file name.
        name = hashlib.sha256(f"{self.identity}\0{session_id}".encode()).hexdigest()[:32]
        return self.directory / f"{name}.safetensors"

    def save(self, session_id: str, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Write a session's KV atomically; returns the file size.

        Raises:
            OSError: the file could not be written; nothing of it is left on disk.
        """
        tensors: dict[str, torch.Tensor] = {"ids": torch.tensor(ids, dtype=torch.int64)}
        dtype = layers[0][0].dtype
        for index, (keys, values) in enumerate(layers):
            for kind, states in (("k", keys), ("v", values)):
                states = states.detach().to("cpu")
                if self.int8:
                    tensors[f"{kind}{index}"], tensors[f"{kind}{index}.scale"] = quantize_int8(states)
                else:
                    tensors[f"{kind}{index}"] = states.contiguous()
        metadata = {
            "format": FORMAT,
            "identity": self.identity,
            "template": self.template_hash,
            "int8": str(self.int8),
            "dtype": str(dtype).removeprefix("torch."),
            "layers": str(len(layers)),
            "key": _key_id(self._signing_key),
        }
        metadata["signature"] = _signature(self._signing_key, session_id, metadata, tensors)
        data = save(tensors, metadata=metadata)  # in memory: the write below is the only I/O
        target = self.path(session_id)
        staging = target.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        try:
            with open(staging, "xb") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)  # held until closed: this file is no leftover
                handle.write(data)
                handle.flush()
                staging.replace(target)
        except BaseException:
            staging.unlink(missing_ok=True)
            raise
        self._remember_ids(target, ids)
        self._enforce_budget(keep=target)
        return len(data)

    def load(self, session_id: str, device: torch.device) -> SpilledKV | None:
        """Read a session's KV, or None when there is none or it cannot be trusted (then it is deleted)."""
        path = self.path(session_id)
        if not path.is_file():
            return None
        try:
            return self._read(path, session_id, device)
        except Exception as exc:  # noqa: BLE001 - any unreadable or untrusted file means: recompute
            log.warning("Spilled KV of session %r (%s) is refused: %s; the turn recomputes it", session_id, path.name, exc)
            self.rejected += 1
            self.discard(session_id)
            return None

    def _read(self, path: Path, session_id: str, device: torch.device) -> SpilledKV:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        if metadata.get("format") == UNSIGNED_FORMAT:
            raise ValueError(f"it was written before spill files were signed ({UNSIGNED_FORMAT})")
        for name, expected in (("format", FORMAT), ("identity", self.identity), ("template", self.template_hash)):
            if metadata.get(name) != expected:
                raise ValueError(f"{name} is {metadata.get(name)!r}, expected {expected!r}")
        key = self._keys.get(metadata.get("key", ""))
        if key is None:
            raise ValueError("it is signed with a key this store does not hold")
        tensors = load_file(str(path))
        signed = {name: value for name, value in metadata.items() if name != "signature"}
        if not hmac.compare_digest(_signature(key, session_id, signed, tensors), metadata.get("signature", "")):
            raise ValueError("its signature does not verify (altered, or written for another session)")
        dtype = getattr(torch, metadata["dtype"])
        layers = []
        for index in range(int(metadata["layers"])):
            pair = []
            for kind in ("k", "v"):
                states = tensors[f"{kind}{index}"]
                if metadata["int8"] == "True":
                    states = dequantize_int8(states, tensors[f"{kind}{index}.scale"], dtype)
                pair.append(states.to(device))
            layers.append((pair[0], pair[1]))
        ids = tensors["ids"].tolist()
        if any(keys.shape[-2] != len(ids) for keys, _ in layers):
            raise ValueError("KV length does not match its ids")
        return SpilledKV(ids=ids, layers=layers)

    def spilled_ids(self, session_id: str) -> Sequence[int] | None:
        """The token ids a session's spilled KV covers, without reading its tensors (and without
        reading the file at all when it is the one this store last wrote or read); None if none
        or unreadable."""
        from safetensors import safe_open

        path = self.path(session_id)
        try:
            version = _version(path)
        except OSError:
            return None
        with self._known_ids_lock:
            known = self._known_ids.get(path.name)
        if known is not None and known[0] == version:
            return known[1]
        try:
            with safe_open(str(path), framework="pt") as handle:
                ids = array("i", handle.get_tensor("ids").tolist())
        except Exception:  # noqa: BLE001 - the restore decides what an unreadable file means
            return None
        with self._known_ids_lock:
            self._known_ids[path.name] = (version, ids)
        return ids

    def _remember_ids(self, path: Path, ids: list[int]) -> None:
        try:
            version = _version(path)
        except OSError:  # already replaced or deleted by another writer: nothing to remember
            return
        with self._known_ids_lock:
            self._known_ids[path.name] = (version, array("i", ids))

    def spilled_bytes(self, session_id: str) -> int:
        """The size of a session's spill file; 0 if it has none."""
        try:
            return self.path(session_id).stat().st_size
        except OSError:
            return 0

    def discard(self, session_id: str) -> None:
        """Delete a session's file. One that cannot be deleted stays: it is never wrong, since
        `load` checks it and the token tier reuses only the prefix its ids share with a prompt."""
        try:
            self.path(session_id).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("Could not delete spilled KV %s (%s)", self.path(session_id).name, exc)

    def _remove_leftovers(self) -> None:
        """Delete temporary files whose writer is gone (killed mid-write): they only take disk."""
        for path, _, _ in self._files(temporary=True):
            try:
                with open(path, "rb") as handle:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a writer holds it
                    path.unlink()
            except BlockingIOError:
                continue
            except OSError as exc:
                log.warning("Could not delete the leftover spill file %s (%s)", path.name, exc)

    def _files(self, temporary: bool) -> list[tuple[Path, int, int]]:
        """(path, size, mtime) of the complete or the temporary files, skipping any deleted meanwhile."""
        found = []
        for path in self.directory.iterdir():
            wanted = TEMPORARY.fullmatch(path.name) is not None if temporary else path.suffix == ".safetensors"
            if not wanted:
                continue
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            found.append((path, info.st_size, info.st_mtime_ns))
        return found

    def _enforce_budget(self, keep: Path) -> None:
        """Delete the least recently written files until the directory fits the budget,
        counting temporary files (which only their writer may delete) but never `keep`."""
        with self._lock:
            files = sorted(self._files(temporary=False), key=lambda file: file[2])
            total = sum(size for _, size, _ in files + self._files(temporary=True))
            for path, size, _ in files:
                if total <= self.budget_bytes:
                    break
                if path != keep:
                    total -= size
                    path.unlink(missing_ok=True)
