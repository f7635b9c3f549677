"""Cold sessions on disk: one safetensors file per session, checked before it is trusted.

A file records the ids its KV covers, the model and template identity, and a SHA-256 of
its tensors. Anything off (truncated, corrupted, written for other weights or another
template) makes `load` return None so the turn recomputes: a spilled file can make a turn
slower, never wrong. Optionally KV is stored as int8 with one scale per (layer, head,
position), about 3.9x smaller on float32 models and not bit-exact on restore.
Never pickle: a cache file must not be able to run code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger("chatcache")
FORMAT = "chatcache-kv/1"


@dataclass(frozen=True)
class SpilledKV:
    """What a spill file restores: the ids its KV covers and the per-layer keys and values."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per vector along the last (head) dimension."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale.to(torch.float32)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.to(torch.float32) * scale).to(dtype)


class SpillStore:
    """Session KV files in a directory, within a byte budget (least recently written go first)."""

    def __init__(self, directory: Path, identity: str, template_hash: str, int8: bool, budget_bytes: int) -> None:
        self.directory = directory
        self.identity = identity
        self.template_hash = template_hash
        self.int8 = int8
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self.rejected = 0  # files found unusable and deleted
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, session_id: str) -> Path:
        # Session ids are user text: hash them into a safe file name.
        name = hashlib.sha256(f"{self.identity}\0{session_id}".encode()).hexdigest()[:32]
        return self.directory / f"{name}.safetensors"

    def save(self, session_id: str, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Write a session's KV atomically; returns the file size."""
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
            "sha256": _checksum(tensors),
        }
        target = self.path(session_id)
        staging = target.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        save_file(tensors, str(staging), metadata=metadata)
        staging.replace(target)
        self._enforce_budget(keep=target)
        return target.stat().st_size

    def load(self, session_id: str, device: torch.device) -> SpilledKV | None:
        """Read a session's KV, or None when there is none or it cannot be trusted (then it is deleted)."""
        path = self.path(session_id)
        if not path.is_file():
            return None
        try:
            return self._read(path, device)
        except Exception as exc:  # noqa: BLE001 - any unreadable file means: recompute
            log.warning("Spilled KV %s is unusable (%s); the turn recomputes it", path.name, exc)
            self.rejected += 1
            self.discard(session_id)
            return None

    def _read(self, path: Path, device: torch.device) -> SpilledKV:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        for key, expected in (("format", FORMAT), ("identity", self.identity), ("template", self.template_hash)):
            if metadata.get(key) != expected:
                raise ValueError(f"{key} is {metadata.get(key)!r}, expected {expected!r}")
        tensors = load_file(str(path))
        if _checksum(tensors) != metadata.get("sha256"):
            raise ValueError("checksum mismatch")
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

    def discard(self, session_id: str) -> None:
        self.path(session_id).unlink(missing_ok=True)

    def _enforce_budget(self, keep: Path) -> None:
        with self._lock:
            files = sorted(self.directory.glob("*.safetensors"), key=lambda p: p.stat().st_mtime_ns)
            total = sum(p.stat().st_size for p in files)
            for path in files:
                if total <= self.budget_bytes:
                    break
                if path != keep:
                    total -= path.stat().st_size
                    path.unlink(missing_ok=True)
