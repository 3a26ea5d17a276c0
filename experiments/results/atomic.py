"""Atomic file replacement: a reader (or a process killed mid-write) sees the old complete file or the new
complete file, never a truncated one.

The bytes go to a temporary file in the same folder (a rename is only atomic within one filesystem),
are flushed and fsynced, and the temporary file is renamed over the target (POSIX rename(2) replaces
atomically); the folder is then fsynced so the rename itself survives a power cut. A writer killed
before the rename leaves a hidden `.<name>.*.tmp` file beside the target, which readers ignore.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

_UMASK = os.umask(0o022)  # read once (umask can only be read by setting it), then put back
os.umask(_UMASK)


def fsync_dir(folder: Path) -> None:
    """Persist a rename in `folder` (no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs) -> Iterator[IO]:
    """`with atomic_open(path, "w") as f: f.write(...)`: path is replaced only if the block completes."""
    path = Path(path)
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; a result file gets the usual permissions
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    with atomic_open(path, "w", encoding=encoding, newline="") as f:
        f.write(text)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_with(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Replace path with what `write(binary file)` writes, e.g. `lambda f: df.to_parquet(f, index=False)`."""
    with atomic_open(path, "wb") as f:
        write(f)
