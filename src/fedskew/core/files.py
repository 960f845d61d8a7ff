"""Writing files so that a failure part-way is an ``OSError`` and never leaves a half-written file.

PyTorch's zip writer turns a failed write (a full disk) into a ``RuntimeError`` from its C++ core
(``[enforce fail at inline_container.cc]``), which no caller can tell from a bug. Serialising to memory
first and writing the bytes with plain file calls keeps the failure what it is: an ``OSError`` with its
errno (``ENOSPC``), which the command line reports in one line.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def torch_bytes(obj: Any) -> bytes:
    """``obj`` as ``torch.save`` writes it, in memory."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_atomic(path: Path, data: bytes | str, *, sync: bool = True) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename it over ``path``.

    A write that fails (a full disk, a folder made read-only) removes the temporary file, leaves ``path``
    as it was and raises the ``OSError``. ``sync`` flushes the file to disk before the rename.
    """
    blob = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # free the space; the old file is untouched
        raise
    return path


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A folder to write the files of ``out`` into, put in place only once all of them are written.

    For a new ``out``, the stage is a hidden folder beside it (``.<name>.partial-<pid>``), renamed to ``out``
    at the end; for an ``out`` that exists (an earlier report), a hidden folder inside it, whose files then
    replace theirs one by one (each rename whole; other files of ``out`` are kept). A write that fails (a full
    disk, a read-only folder) or any other error removes the stage and leaves ``out`` as it was.
    """
    grown = out.is_dir()
    stage = out / f".partial-{os.getpid()}" if grown else out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        stage.mkdir(parents=True)
        yield stage
        if grown:
            for f in sorted(p for p in stage.rglob("*") if not p.is_dir()):
                target = out / f.relative_to(stage)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, target)
            shutil.rmtree(stage)
        else:
            stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
