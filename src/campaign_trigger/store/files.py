"""File storage for uploads and reports: any fsspec URL (a local folder by default).

Paths handed around are *keys* relative to the storage root: ``uploads/<request_id>.csv``
(a CSV as uploaded), ``messages/<request_id>.arrow`` (every request's messages, parsed
once) and ``reports/<request_id>/<app_id>.csv``. In a local folder, files are created
0600 and folders 0700 (they hold users' messages and delivery reports); object stores
keep their own access rules. A file that may be read while it is written again (a
report, whose link may be downloading it) is written with :meth:`Storage.replace`.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, Final

import fsspec
from fsspec.core import url_to_fs

from campaign_trigger.config import Settings
from campaign_trigger.store.private import private_dir, private_file

ABANDONED_AFTER: Final = timedelta(days=1)
"""The age at which a file that a call was writing when its process died is deleted (a
create's upload or message file whose request was never stored, a preview's scratch
folder): no call writes, checks and stores for that long."""


def upload_key(request_id: str) -> str:
    return f"uploads/{request_id}.csv"


def messages_key(request_id: str) -> str:
    return f"messages/{request_id}.arrow"


def report_key(request_id: str, app_id: str) -> str:
    return f"reports/{request_id}/{app_id}.csv"


class Storage:
    """Keys under one fsspec root."""

    def __init__(self, url: str) -> None:
        self.fs: fsspec.AbstractFileSystem
        self.fs, self.root = url_to_fs(url)
        self.root = self.root.rstrip("/")

    def path(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad storage key {key!r}")
        return f"{self.root}/{key}"

    def open(self, key: str, mode: str = "rb", **kwargs: Any) -> IO[Any]:
        path = self.path(key)
        if "w" in mode or "a" in mode or "x" in mode:
            local = self.local_path(key)
            if local is not None:
                private_file(Path(local))  # 0600 before a byte is written
            else:
                self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        return self.fs.open(path, mode, **kwargs)  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def replace(self, key: str) -> Iterator[IO[Any]]:
        """Write ``key`` anew, whole or not at all: into a temporary key beside it, which
        then takes its place in one step. A reader of the old file (a report link being
        downloaded) reads it to its end, and a write that fails leaves it as it was.

        Locally ``os.replace``; elsewhere the store's move (an object store's copy shows the
        new object at once, then deletes the temporary one). A temporary key left by a
        process that died is its request's file still, deleted with it (housekeeping)."""
        folder, _, name = key.rpartition("/")
        temporary = f"{folder}/" if folder else ""
        temporary += f".{name}.{uuid.uuid4().hex}.tmp"
        try:
            with self.open(temporary, "wb") as handle:
                yield handle
            local, local_temporary = self.local_path(key), self.local_path(temporary)
            if local is not None and local_temporary is not None:
                os.replace(local_temporary, local)
            else:
                self.fs.mv(self.path(temporary), self.path(key))
        except BaseException:
            with contextlib.suppress(Exception):
                self.delete(temporary)
            raise

    def make_root(self) -> None:
        """Create a local root folder (0700) if it is missing; other stores need none."""
        local = self.local_path("probe")
        if local is not None:
            private_dir(Path(self.root))

    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(self.path(key)))

    def delete(self, key: str) -> None:
        if self.fs.exists(self.path(key)):
            self.fs.rm(self.path(key))

    def size(self, key: str) -> int:
        return int(self.fs.size(self.path(key)))

    def local_path(self, key: str) -> str | None:
        """A filesystem path when storage is local (fast paths such as pyarrow), else None."""
        protocol = self.fs.protocol
        protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
        return self.path(key) if "file" in protocols or "local" in protocols else None


def get_storage(settings: Settings) -> Storage:
    return Storage(settings.storage_url)
