"""Fingerprint a model's weights: what spilled KV and cached answers are keyed by.

The fingerprint covers every weight, the config and the dtype the weights were loaded in,
so changing one value anywhere (a later layer too) gives a new identity, and never the path:
the same files in another directory are the same model, so their KV and answers are shared.

Loaded from files, the fingerprint is made of the files' SHA-256 digests (the whole file, so
a safetensors header counts too). Hashing is ~0.4 s per 500 MB, so each digest is remembered
in the data directory under the file's resolved path, size, mtime, ctime and inode, and a
file is hashed again only when one of those changes. A model built in memory is fingerprinted
from its state dict instead.

What it deliberately does not do: notice an edit that restores size, mtime and ctime and
keeps the inode (ctime cannot be set back without changing the clock).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..config import default_data_dir

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_DIGESTS_FILE = "weights-digests.json"
_lock = threading.Lock()
# Recorded by the loader, so they differ for the same weights; they do not change what the model computes.
_PER_LOAD_CONFIG_KEYS = ("_name_or_path", "_commit_hash")


def weights_identity(model: PreTrainedModel, directory: Path | None = None) -> str:
    """The identity of `model`'s weights: its type, then a digest (`llama@3f2a...`).

    Args:
        model: the loaded model.
        directory: where its weights were loaded from; None (or a directory without weight
            files) fingerprints the tensors in memory.
    """
    config = json.loads(model.config.to_json_string(use_diff=False))
    for key in _PER_LOAD_CONFIG_KEYS:
        config.pop(key, None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    digest.update(f"\0{model.dtype}\0".encode())
    files = weight_files(directory) if directory is not None else []
    if files:
        for name, file_digest in weight_digests(files).items():
            digest.update(f"{name}\0{file_digest}\0".encode())
    else:
        digest.update(tensors_digest(model).encode())
    return f"{model.config.model_type}@{digest.hexdigest()[:32]}"


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a saved model: its safetensors files, else its PyTorch `.bin` files."""
    for pattern in ("*.safetensors", "*.bin"):
        files = sorted(path for path in directory.glob(pattern) if path.is_file())
        if files:
            return files
    return []


def weight_digests(files: list[Path]) -> dict[str, str]:
    """SHA-256 of each file by name, from the data directory's record where the file is unchanged."""
    with _lock:
        record_path = default_data_dir() / _DIGESTS_FILE
        record = _read_record(record_path)
        digests, changed = {}, False
        for path in files:
            resolved = path.resolve()  # a Hugging Face snapshot links each file to its blob
            stat = resolved.stat()
            key = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
            entry = record.get(str(resolved))
            if entry is None or entry.get("stat") != key:
                entry = {"stat": key, "sha256": hash_file(resolved)}
                record[str(resolved)] = entry
                changed = True
            digests[path.name] = str(entry["sha256"])
        if changed:
            _write_record(record_path, {name: entry for name, entry in record.items() if Path(name).exists()})
        return digests


def hash_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def tensors_digest(model: PreTrainedModel) -> str:
    """SHA-256 over every tensor of the state dict: names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _read_record(path: Path) -> dict[str, dict[str, object]]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: every file is hashed again, nothing worse
    return record if isinstance(record, dict) else {}


def _write_record(path: Path, record: dict[str, dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
    staging.write_text(json.dumps(record, indent=0, sort_keys=True))
    staging.replace(path)  # another process reading at the same time sees the old or the new record
