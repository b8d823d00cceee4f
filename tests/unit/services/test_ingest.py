"""Message files: format sniffing, streaming to storage, validation in windows (local
memory-mapped files and remote fsspec storage alike)."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest

from campaign_trigger.errors import InvalidInput, PayloadTooLarge
from campaign_trigger.services.ingest import (
    UNSUPPORTED,
    UploadWriter,
    copy_to_storage,
    sniff_csv,
    validate_message_file,
)
from campaign_trigger.store.files import Storage


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return Storage(str(tmp_path))
    return Storage(f"memory://ingest-{uuid.uuid4().hex}")


def _store(storage: Storage, content: bytes) -> str:
    key = f"uploads/{uuid.uuid4().hex}.csv"
    copy_to_storage(io.BytesIO(content), storage=storage, key=key, max_bytes=10**9)
    return key


def _rows(n: int, *, newline: bytes = b"\n") -> bytes:
    lines = [b"User,first_name,code"] + [f"user-{i},N\xc3\xa9{i},C{i}".encode() for i in range(n)]
    return newline.join(lines) + newline


@pytest.mark.parametrize("window", [64, 1000, 16 << 20])
@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_rows_are_counted_across_windows(storage: Storage, window: int, newline: bytes) -> None:
    key = _store(storage, _rows(500, newline=newline))
    assert (
        validate_message_file(
            storage=storage, key=key, variables=["first_name", "code"], window_bytes=window
        )
        == 500
    )


def test_file_without_final_newline_and_with_bom(storage: Storage) -> None:
    key = _store(storage, b"\xef\xbb\xbfUser,code\nu1,a\nu2,b")
    assert validate_message_file(storage=storage, key=key, variables=["code"], window_bytes=8) == 2


def test_quoted_values_are_read(storage: Storage) -> None:
    key = _store(storage, b'User,code\n"u,1","say ""hi"""\n')
    assert validate_message_file(storage=storage, key=key, variables=["code"]) == 1


@pytest.mark.parametrize("window", [32, 16 << 20])
def test_empty_user_is_reported_with_its_row(storage: Storage, window: int) -> None:
    content = _rows(50).replace(b"\nuser-37,", b"\n,")
    key = _store(storage, content)
    with pytest.raises(InvalidInput) as caught:
        validate_message_file(storage=storage, key=key, variables=["code"], window_bytes=window)
    assert caught.value.message == "Invalid file : empty 'User' value on row 38"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"User,code\n", "Invalid file : no messages (the file has a header and no rows)"),
        (b"\n\n", "Error when reading CSV file: the header line is empty"),
        (b"User,User,code\nu,v,w\n", "Error when reading CSV file: duplicate column 'User'"),
        (
            b"Us\xe9r,code\nu,w\n",
            "Error when reading CSV file: invalid UTF-8 in the header line "
            "(invalid continuation byte)",
        ),
        (
            b'User,code\nu1,"abc\nu2,x\n',
            "Error when reading CSV file: unterminated quoted value or "
            "line break inside a value in column 'code'",
        ),
    ],
)
def test_reading_errors(storage: Storage, content: bytes, message: str) -> None:
    key = _store(storage, content)
    with pytest.raises(InvalidInput) as caught:
        validate_message_file(storage=storage, key=key, variables=["code"])
    assert caught.value.message == message


def test_variables_named_like_model_attributes(storage: Storage) -> None:
    key = _store(storage, b"User,validate,Config\nu1,a,b\n")
    assert validate_message_file(storage=storage, key=key, variables=["validate", "Config"]) == 1


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
    import hashlib

    assert writer.sha256 == hashlib.sha256(b"x" * 5_000_000).hexdigest()
