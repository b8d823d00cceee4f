"""The CSV ingest: the upload parsed once into the message file, values verbatim, in
blocks (local and remote fsspec storage alike)."""

from __future__ import annotations

import csv
import io
import re
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaign_trigger.errors import InvalidInput
from campaign_trigger.services.ingest import ingest_message_file
from campaign_trigger.services.message_file import USER_FIELD, read_chunk
from campaign_trigger.services.uploads import copy_to_storage
from campaign_trigger.store.files import Storage


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return Storage(str(tmp_path))
    return Storage(f"memory://ingest-{uuid.uuid4().hex}")


def _ingest(
    storage: Storage,
    content: bytes,
    variables: list[str],
    *,
    chunk_size: int = 1000,
    block_bytes: int = 8 << 20,
) -> tuple[int, str]:
    key = f"uploads/{uuid.uuid4().hex}.csv"
    writer = copy_to_storage(io.BytesIO(content), storage=storage, key=key, max_bytes=10**9)
    messages = f"messages/{uuid.uuid4().hex}.arrow"
    rows = ingest_message_file(
        storage=storage,
        upload_key=key,
        facts=writer.facts,
        messages_key=messages,
        variables=variables,
        chunk_size=chunk_size,
        block_bytes=block_bytes,
    )
    return rows, messages


def _all_rows(storage: Storage, key: str, rows: int, chunk_size: int) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for chunk_no in range(-(-rows // chunk_size)):
        out.extend(read_chunk(storage=storage, key=key, chunk_no=chunk_no).to_pylist())
    return out


def _rows(n: int, *, newline: bytes = b"\n") -> bytes:
    lines = [b"User,first_name,code"] + [f"user-{i},Né{i},C{i}".encode() for i in range(n)]
    return newline.join(lines) + newline


@pytest.mark.parametrize("block", [64, 1000, 16 << 20])
@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_rows_are_read_across_blocks_in_order(storage: Storage, block: int, newline: bytes) -> None:
    rows, key = _ingest(
        storage,
        _rows(500, newline=newline),
        ["first_name", "code"],
        chunk_size=64,
        block_bytes=block,
    )
    assert rows == 500
    read = _all_rows(storage, key, rows, 64)
    assert [r[USER_FIELD] for r in read] == [f"user-{i}" for i in range(500)]
    assert read[499] == {USER_FIELD: "user-499", "first_name": "Né499", "code": "C499"}


def test_every_chunk_but_the_last_holds_chunk_size_rows(storage: Storage) -> None:
    _, key = _ingest(storage, _rows(250), ["code"], chunk_size=100, block_bytes=64)
    sizes = [read_chunk(storage=storage, key=key, chunk_no=k).num_rows for k in range(3)]
    assert sizes == [100, 100, 50]


def test_values_are_kept_verbatim(storage: Storage) -> None:
    content = (
        b"User,code,amount\n"
        b"u1,007,2.00\n"
        b"u2,NA,null\n"
        b"u3,,TRUE\n"
        b"u4, 1e3 ,nan\n"
        b'u5,"a, ""quoted"" value","two\r\nlines"\n'
        b"u6,\xf0\x9f\x94\x91 \xd8\xb4\xd9\x83\xd8\xb1\xd8\xa7,{{ other }}\n"
    )
    rows, key = _ingest(storage, content, ["code", "amount"])
    assert _all_rows(storage, key, rows, 1000) == [
        {USER_FIELD: "u1", "code": "007", "amount": "2.00"},
        {USER_FIELD: "u2", "code": "NA", "amount": "null"},
        {USER_FIELD: "u3", "code": "", "amount": "TRUE"},
        {USER_FIELD: "u4", "code": " 1e3 ", "amount": "nan"},
        {USER_FIELD: "u5", "code": 'a, "quoted" value', "amount": "two\r\nlines"},
        {USER_FIELD: "u6", "code": "🔑 شكرا", "amount": "{{ other }}"},
    ]


def test_only_the_users_and_the_campaign_variables_are_kept(storage: Storage) -> None:
    rows, key = _ingest(storage, b"extra,User,code,more\nx,u1,c,y\n", ["code"])
    assert _all_rows(storage, key, rows, 1000) == [{USER_FIELD: "u1", "code": "c"}]


def test_a_variable_named_user_is_the_user_id(storage: Storage) -> None:
    rows, key = _ingest(storage, b"User,code\nu1,c\n", ["User", "code"])
    assert _all_rows(storage, key, rows, 1000) == [{USER_FIELD: "u1", "User": "u1", "code": "c"}]


def test_file_without_final_newline_and_with_bom(storage: Storage) -> None:
    rows, key = _ingest(storage, b"\xef\xbb\xbfUser,code\nu1,a\nu2,b", ["code"], block_bytes=16)
    assert _all_rows(storage, key, rows, 1000) == [
        {USER_FIELD: "u1", "code": "a"},
        {USER_FIELD: "u2", "code": "b"},
    ]


@pytest.mark.parametrize("block", [32, 16 << 20])
def test_empty_user_is_reported_with_its_row(storage: Storage, block: int) -> None:
    content = _rows(50).replace(b"\nuser-37,", b"\n,")
    with pytest.raises(InvalidInput) as caught:
        _ingest(storage, content, ["code"], block_bytes=block)
    assert caught.value.message == "Invalid file : empty 'User' value on row 39"


def test_a_row_has_one_number_whichever_check_refuses_it(storage: Storage) -> None:
    # pyarrow's parse errors count the header as row 1 (and no blank line): so do ours
    ragged, empty = b"User,code\nu1,a\n\nu2,b,c\n", b"User,code\nu1,a\n\n,b\n"
    with pytest.raises(InvalidInput) as by_parser:
        _ingest(storage, ragged, ["code"])
    with pytest.raises(InvalidInput) as by_schema:
        _ingest(storage, empty, ["code"])
    assert "Row #3:" in by_parser.value.message
    assert by_schema.value.message == "Invalid file : empty 'User' value on row 3"


def test_blank_and_too_long_users_are_refused(storage: Storage) -> None:
    with pytest.raises(InvalidInput) as caught:
        _ingest(storage, b"User,code\nu1,a\n   ,b\n", ["code"])
    assert caught.value.message == "Invalid file : empty 'User' value on row 3"
    with pytest.raises(InvalidInput) as caught:
        _ingest(storage, b"User,code\n" + b"u" * 201 + b",a\n", ["code"])
    assert caught.value.message == "Invalid file : 'User' value longer than 200 characters on row 2"
    rows, _ = _ingest(storage, b"User,code\n" + b"u" * 200 + b",a\n", ["code"])
    assert rows == 1


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
            "Error when reading CSV file: unbalanced quotes: a quoted value is not closed, "
            "or an unquoted value holds a quote (quote such values and double their "
            'quotes: "say ""hi""")',
        ),
        (
            b"User,code\nu1,a\n" + b"u2,b\n" * 5000 + b"u3,c\x00d\n",
            "Error when reading CSV file: a NUL byte (\\x00) at byte 25019 of the file",
        ),
        (
            b"User,code\nu1,a,b\n",
            "Error when reading CSV file: CSV parse error: Row #2: Expected 2 columns, got 3",
        ),
    ],
)
def test_reading_errors(storage: Storage, content: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        _ingest(storage, content, ["code"])
    assert caught.value.message == message
    assert (
        not storage.fs.exists(storage.path("messages"))
        or storage.fs.ls(storage.path("messages")) == []
    )


@pytest.mark.parametrize(
    "content",
    [
        b"User,code\nbob,987654,extra\n",  # a row too long
        b"User,code\nu0,1\n" + b"u1,2\n" * 3000 + b"bob,987654,extra\n",  # in a later block
        b"User,code,name\nbob,987654\n",  # a row too short
    ],
)
def test_a_ragged_row_is_named_by_its_number_not_by_its_content(
    storage: Storage, content: bytes
) -> None:
    """The message is also what a refused send-batch run shows in the Prefect UI."""
    with pytest.raises(InvalidInput) as caught:
        _ingest(storage, content, ["code"], block_bytes=4096)
    message = caught.value.message
    assert "bob" not in message
    assert "987654" not in message
    assert re.fullmatch(
        r"Error when reading CSV file: CSV parse error: (Row #\d+: )?Expected \d columns, got \d",
        message,
    ), message


def test_invalid_utf8_in_a_value_is_refused(storage: Storage) -> None:
    with pytest.raises(InvalidInput) as caught:
        _ingest(storage, b"User,code\nu1,Caf\xe9\n", ["code"])
    assert caught.value.message.startswith("Error when reading CSV file: ")
    assert "UTF8" in caught.value.message or "UTF-8" in caught.value.message


def test_variables_named_like_model_attributes(storage: Storage) -> None:
    rows, _ = _ingest(storage, b"User,validate,Config\nu1,a,b\n", ["validate", "Config"])
    assert rows == 1


_TEXT = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=30,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(st.tuples(_TEXT, _TEXT), min_size=1, max_size=20))
def test_any_text_a_csv_writer_quotes_is_read_back_exactly(
    tmp_path: Path, values: list[tuple[str, str]]
) -> None:
    storage = Storage(str(tmp_path / uuid.uuid4().hex))
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\r\n")
    writer.writerow(["User", "a", "b"])
    writer.writerows([f"u{n}", a, b] for n, (a, b) in enumerate(values))
    rows, key = _ingest(
        storage, text.getvalue().encode(), ["a", "b"], chunk_size=7, block_bytes=1024
    )
    assert _all_rows(storage, key, rows, 7) == [
        {USER_FIELD: f"u{n}", "a": a, "b": b} for n, (a, b) in enumerate(values)
    ]


@pytest.mark.parametrize("block", [64, 1024])
def test_a_line_break_in_a_value_split_by_a_block_end_is_kept(storage: Storage, block: int) -> None:
    # pyarrow (26.0.1) read a quoted value's "\r\n" as "\r" when the "\r" was a block's
    # last byte: the message arrived without its line break, and nothing said so.
    header = b"User,code\n"
    for at in range(block - 3, block + 3):  # the "\r"'s offset in the file
        value = "a" * (at - len(header) - len('u1,"')) + "\r\nb"
        content = header + f'u1,"{value}"\r\nu2,c\r\n'.encode()
        assert content.index(b"\r") == at
        rows, key = _ingest(storage, content, ["code"], chunk_size=10, block_bytes=block)
        assert _all_rows(storage, key, rows, 10)[0]["code"] == value, at
