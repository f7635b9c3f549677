"""Make a file or directory of the data directory once, however many processes ask for it at once.

Replicas started together, `chatcache ask` run in parallel and test workers all find the data
directory fresh and reach for the same artefacts: the converted bundled model, the record of
weight digests. `produce_once` lets one of them make it and the others wait for it:

- an exclusive advisory lock (`fcntl.flock`) on `<target>.lock` beside the target, taken only
  when the target is not current; a process that waited checks again and finds it made;
- the producer writes into a staging directory of its own beside the target (the same file
  system), then renames the result into place, so no process ever reads a half-made target,
  and one killed mid-way leaves only its staging directory (`.<name>.*.staging`), which the
  next producer removes (staging happens only under the lock, so any it finds is a leftover).

What it deliberately does not do: delete lock files (a process could be waiting on the one it
opened; removing it would let the next one lock a new file while it holds the old), or settle
between processes that disagree on what is current (two versions of a package sharing one
data directory): each replaces the other's artefact whenever it finds it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_STAGING = ".staging"


def produce_once(target: Path, is_current: Callable[[Path], bool], produce: Callable[[Path], None]) -> Path:
    """Return `target`, made by `produce` unless `is_current(target)`, one process and thread at a time.

    Args:
        target: the artefact's path (a file or a directory); its parent is created.
        is_current: whether the target as it stands can be used; called before the lock and
            again once it is held (another process may have made it meanwhile).
        produce: makes the artefact at the path it is given (which does not exist yet), in a
            staging directory beside `target`; what it leaves there replaces `target` whole.

    Returns:
        `target`.

    Raises:
        Whatever `produce` raises; `target` is then left as it was.
    """
    if is_current(target):
        return target
    with _locked(target):
        if is_current(target):
            return target  # made by the process this one waited for
        _remove_leftovers(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=_STAGING, dir=target.parent))
        try:
            produce(staging / target.name)
            if target.is_dir():
                target.rename(staging / f"{target.name}.replaced")  # rename cannot replace a directory that has files
            (staging / target.name).rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


@contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold the exclusive lock on `target` (a lock file beside it) for the `with` block."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # Each opening is its own lock owner, so threads of one process exclude each other too;
    # closing the file releases the lock, also when the process is killed.
    with open(target.with_name(target.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _remove_leftovers(target: Path) -> None:
    """Remove staging directories of producers of `target` that died (only called under its lock)."""
    prefix = f".{target.name}."
    for entry in os.scandir(target.parent):
        # mkdtemp's random part has no dot: `.model.v2.abc.staging` is model.v2's, not model's.
        middle = entry.name[len(prefix) : -len(_STAGING)]
        if entry.name.startswith(prefix) and entry.name.endswith(_STAGING) and "." not in middle:
            shutil.rmtree(entry.path, ignore_errors=True)
