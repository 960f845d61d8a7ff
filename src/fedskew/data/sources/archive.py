"""Read-only access to the files of a folder, a tar archive or a zip archive."""

from __future__ import annotations

import os
import tarfile
import zipfile
import zlib
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

from fedskew.core.errors import DataError

__all__ = ["Tree"]

_ARCHIVE_ERRORS = (OSError, EOFError, zlib.error, tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile)


class Tree:
    """Read-only view of the files in a folder, a tar archive (any compression) or a zip archive.

    Members are named by relative POSIX paths. Hidden files and macOS ``__MACOSX`` debris are
    skipped. Reading happens in archive order, which keeps compressed tar streams sequential.
    """

    def __init__(self, source: Path) -> None:
        self.source = source
        self._tar: tarfile.TarFile | None = None
        self._zip: zipfile.ZipFile | None = None
        self._tar_members: dict[str, tarfile.TarInfo] = {}
        try:
            if source.is_dir():
                return
            if tarfile.is_tarfile(source):
                self._tar = tarfile.open(source, "r:*")  # noqa: SIM115  (closed in __exit__)
            elif zipfile.is_zipfile(source):
                self._zip = zipfile.ZipFile(source)
            else:
                raise DataError(f"{source}: not a folder, tar or zip archive")
        except _ARCHIVE_ERRORS as exc:
            raise DataError(f"{source}: cannot open ({exc})") from exc

    def __enter__(self) -> Tree:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._tar is not None:
            self._tar.close()
        if self._zip is not None:
            self._zip.close()

    @staticmethod
    def _visible(name: str) -> bool:
        return not any(part.startswith(".") or part == "__MACOSX" for part in name.split("/"))

    def names(self) -> list[str]:
        """All visible files, as relative POSIX paths."""
        try:
            if self._tar is not None:
                for info in self._tar.getmembers():
                    name = info.name.removeprefix("./")
                    if info.isfile() and self._visible(name):
                        self._tar_members[name] = info
                return list(self._tar_members)
            if self._zip is not None:
                return [i.filename for i in self._zip.infolist() if not i.is_dir() and self._visible(i.filename)]
            found: list[str] = []
            for dirpath, dirnames, filenames in os.walk(self.source):
                dirnames[:] = sorted(d for d in dirnames if self._visible(d))
                rel = Path(dirpath).relative_to(self.source)
                found.extend((rel / f).as_posix() for f in sorted(filenames) if self._visible(f))
            return found
        except _ARCHIVE_ERRORS as exc:
            raise DataError(f"{self.source}: corrupt or unreadable ({exc})") from exc

    def read(self, names: Collection[str]) -> dict[str, bytes]:
        """Contents of the given members (which must come from :meth:`names`)."""
        wanted = set(names)
        out: dict[str, bytes] = {}
        try:
            if self._tar is not None:
                if not self._tar_members:
                    self.names()
                for name, info in self._tar_members.items():
                    if name in wanted:
                        handle = self._tar.extractfile(info)
                        if handle is None:
                            raise DataError(f"{self.source}:{name}: not a regular file")
                        out[name] = handle.read()
            elif self._zip is not None:
                for name in sorted(wanted):
                    out[name] = self._zip.read(name)
            else:
                for name in sorted(wanted):
                    out[name] = (self.source / name).read_bytes()
        except KeyError as exc:
            raise DataError(f"{self.source}: missing member {exc}") from exc
        except _ARCHIVE_ERRORS as exc:
            raise DataError(f"{self.source}: corrupt or unreadable ({exc})") from exc
        missing = wanted - set(out)
        if missing:
            raise DataError(f"{self.source}: missing {sorted(missing)[0]}")
        return out
