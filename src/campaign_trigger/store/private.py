"""Files and folders readable by this user only, from their creation on.

The service's home holds the signing secret, the SQLite database (with SDK and
identity keys), uploads and reports: folders are created 0700 and files 0600 with
``os.open``'s mode, so no file is ever readable by others, not even between its
creation and a ``chmod``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents, 0700 (an existing folder is left as is)."""
    if path.is_dir():
        return
    if not path.parent.exists():
        private_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=DIR_MODE)


def private_file(path: Path) -> None:
    """Make sure ``path`` exists and is 0600: create it empty with that mode, or take the
    group's and others' rights away from an existing file of ours."""
    private_dir(path.parent)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        status = path.stat()
        if status.st_uid == os.getuid() and status.st_mode & 0o077:
            path.chmod(FILE_MODE)
        return
    os.close(descriptor)
