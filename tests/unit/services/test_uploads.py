"""Uploads: format sniffing, streaming to storage, and what the writer notes of the bytes
(local and remote fsspec storage alike)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

from campaign_trigger.errors import InvalidInput, PayloadTooLarge
from campaign_trigger.services.uploads import UNSUPPORTED, UploadWriter, sniff_csv
from campaign_trigger.store.files import Storage


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return Storage(str(tmp_path))
    return Storage(f"memory://uploads-{uuid.uuid4().hex}")


@pytest.mark.parametrize(
    ("head", "filename", "content_type"),
    [
        (b"User\nu1\n", "u.csv", "text/csv"),
        (b"User\nu1\n", "u.CSV", None),
        (b"User\nu1\n", "u.txt", "text/plain"),
        (b"User\nu1\n", None, "application/vnd.ms-excel"),
        (b"User,name\nu1,Caf\xe9\n", "u.csv", "text/csv"),  # latin-1: the reader reports it
    ],
)
def test_text_files_pass_the_sniffer(
    head: bytes, filename: str | None, content_type: str | None
) -> None:
    sniff_csv(head, filename=filename, content_type=content_type)


@pytest.mark.parametrize(
    ("head", "filename", "content_type"),
    [
        (b"User\nu1\n", "u.json", "text/csv"),
        (b"User\nu1\n", "u.csv", "application/json"),
        (b"%PDF-1.4 ...", "u.csv", "text/csv"),
        (b"PK\x03\x04....", "u.csv", "text/csv"),
        (b"\x1f\x8b\x08\x00", "u.csv.gz", None),
        (b"<?xml version='1.0'?><a/>", "u.csv", "text/csv"),
        (b"\x01\x02\x03\x04\x05\x06User", "u.csv", "text/csv"),
    ],
)
def test_binary_or_other_formats_are_unsupported(
    head: bytes, filename: str, content_type: str | None
) -> None:
    with pytest.raises(InvalidInput) as caught:
        sniff_csv(head, filename=filename, content_type=content_type)
    assert caught.value.message == UNSUPPORTED


def test_upload_writer_stops_at_the_limit(storage: Storage) -> None:
    writer = UploadWriter(storage=storage, key="uploads/big.csv", max_bytes=10)
    writer.add(b"12345")
    with pytest.raises(PayloadTooLarge):
        writer.add(b"678901")
    writer.discard()
    assert not storage.exists("uploads/big.csv")


def test_upload_writer_keeps_the_head_and_hash(storage: Storage) -> None:
    writer = UploadWriter(storage=storage, key="uploads/h.csv", max_bytes=10**9, hash_content=True)
    for _ in range(5000):
        if writer.add(b"x" * 1000):
            writer.flush()
    writer.close()
    assert len(writer.head) == 8192
    assert writer.size == storage.size("uploads/h.csv") == 5_000_000
    assert writer.sha256 == hashlib.sha256(b"x" * 5_000_000).hexdigest()


def test_upload_writer_notes_nul_bytes_and_quotes_anywhere(storage: Storage) -> None:
    writer = UploadWriter(storage=storage, key="uploads/n.csv", max_bytes=10**9)
    piece = b'User,v\nu1,"a ""b"""\n' + b"x" * (3 << 20)
    for data in (piece, b"u2,c\x00d\n", b'u3,"e\n'):
        if writer.add(data):
            writer.flush()
    writer.close()
    assert writer.facts.nul_offset == len(piece) + 4
    assert writer.facts.quote_count == 7
