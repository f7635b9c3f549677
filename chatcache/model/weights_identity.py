"""Fingerprint a model's weights: what spilled KV and cached answers are keyed by.

The fingerprint covers every weight, the config and the dtype the weights were loaded in,
so changing one value anywhere (a later layer too) gives a new identity, and never the path:
the same files in another directory are the same model, so their KV and answers are shared.

Loaded from files, the fingerprint is made of the files' SHA-256 digests (the whole file, so
a safetensors header counts too). Hashing is ~0.4 s per 500 MB, so each digest is remembered
in the data directory under the file's resolved path, size, mtime, ctime and inode, and a
file is hashed again only when one of those changes. Processes update that record one at a
time (`first_run`), so digests two of them add at once are both kept. A model built in
memory is fingerprinted from its state dict instead.

What it deliberately does not do: notice an edit that restores size, mtime and ctime and
keeps the inode (ctime cannot be set back without changing the clock).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..config import default_data_dir
from ..first_run import produce_once

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_DIGESTS_FILE = "weights-digests.json"
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
    """SHA-256 of each file by name, from the data directory's record where the file is unchanged.

    Processes that need digests at once (replicas loading the same new weights) take turns
    under the record's lock (`first_run`): each adds its digests to the record as the one
    before left it, so none undoes another's, and weights that one process hashed the others find.
    """
    record_path = default_data_dir() / _DIGESTS_FILE
    resolved = {path.name: path.resolve() for path in files}  # a Hugging Face snapshot links each file to its blob
    record: dict[str, dict[str, object]] = {}

    def is_current(path: Path) -> bool:
        record.clear()
        record.update(_read_record(path))
        return all(_unchanged(record.get(str(file)), file) for file in resolved.values())

    def add_digests(staging: Path) -> None:
        # `record` is as is_current read it last, under the lock: what other processes added stays.
        for file in resolved.values():
            if not _unchanged(record.get(str(file)), file):
                record[str(file)] = {"stat": _stat_key(file), "sha256": hash_file(file)}
        kept = {name: entry for name, entry in record.items() if Path(name).exists()}
        staging.write_text(json.dumps(kept, indent=0, sort_keys=True))

    produce_once(record_path, is_current, add_digests)
    return {name: str(record[str(file)]["sha256"]) for name, file in resolved.items()}


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


def _stat_key(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def _unchanged(entry: dict[str, object] | None, path: Path) -> bool:
    """Whether `entry` was recorded for `path` as it is now."""
    return entry is not None and entry.get("stat") == _stat_key(path)
