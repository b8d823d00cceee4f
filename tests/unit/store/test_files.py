"""Storage.replace: a file written again is replaced whole, in a local folder and in an
fsspec store (memory:// here, as an object store would be)."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import pytest

from campaign_trigger.store.files import Storage

KEY = "reports/r1/app.csv"


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return Storage(str(tmp_path / "storage"))
    return Storage(f"memory://files-{uuid.uuid4().hex}")


def _keys(storage: Storage) -> list[str]:
    root = storage.root.rstrip("/") + "/"
    return sorted(str(path).removeprefix(root) for path in storage.fs.find(storage.root))


def test_a_reader_of_the_old_file_reads_it_whole_as_it_is_replaced(storage: Storage) -> None:
    old, new = b"a" * 5000, b"b" * 7000
    with storage.replace(KEY) as handle:
        handle.write(old)
    with storage.open(KEY, "rb") as reader:
        start = reader.read(1000)
        with storage.replace(KEY) as handle:
            handle.write(new)
        assert start + reader.read() == old
    with storage.open(KEY, "rb") as reader:
        assert reader.read() == new
    assert _keys(storage) == [KEY]  # no temporary key left


def test_a_write_that_fails_leaves_the_old_file_as_it_was(storage: Storage) -> None:
    with storage.replace(KEY) as handle:
        handle.write(b"old")

    def fail_midway() -> None:
        with storage.replace(KEY) as handle:
            handle.write(b"half of the new")
            raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        fail_midway()
    with storage.open(KEY, "rb") as reader:
        assert reader.read() == b"old"
    assert _keys(storage) == [KEY]


def test_a_replaced_local_file_is_private(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "storage"))
    for content in (b"first", b"second"):
        with storage.replace(KEY) as handle:
            handle.write(content)
    local = storage.local_path(KEY)
    assert local is not None
    assert stat.S_IMODE(Path(local).stat().st_mode) == 0o600
