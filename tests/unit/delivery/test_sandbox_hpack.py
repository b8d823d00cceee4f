"""The sandbox's HPACK decoder agrees with the reference encoder (the ``hpack`` package)
on any header list, Huffman or not, through a shared dynamic table; and refuses bad input."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from campaign_trigger.delivery.sandbox_hpack import Decoder, HpackError, huffman_decode

names = st.sampled_from(
    [b":path", b":authority", b"authorization", b"apns-id", b"apns-topic", b"x-custom"]
) | st.binary(min_size=1, max_size=20).map(lambda raw: raw.lower().replace(b":", b"x"))
values = st.binary(max_size=300)
header_lists = st.lists(st.tuples(names, values), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(header_lists, min_size=1, max_size=8), st.booleans(), st.integers(0, 4096))
def test_decoding_matches_the_reference_encoder_block_after_block(
    blocks: list[list[tuple[bytes, bytes]]], huffman: bool, table_size: int
) -> None:
    encoder, decoder = hpack.Encoder(), Decoder()
    encoder.header_table_size = table_size  # a size update at the start of the next block
    for headers in blocks:
        assert decoder.decode(encoder.encode(headers, huffman=huffman)) == headers


def test_huffman_strings_decode_and_bad_padding_or_eos_is_refused() -> None:
    encoded = hpack.huffman.HuffmanEncoder(
        hpack.huffman_constants.REQUEST_CODES, hpack.huffman_constants.REQUEST_CODES_LENGTH
    ).encode(b"/3/device/ok-1234")
    assert huffman_decode(encoded) == b"/3/device/ok-1234"
    with pytest.raises(HpackError, match="padding"):
        huffman_decode(b"\x00")  # "0" (00000), then padding 000: padding must be ones
    with pytest.raises(HpackError, match="EOS"):
        huffman_decode(b"\xff\xff\xff\xff")  # 30 one-bits: the EOS symbol


def test_an_index_out_of_the_tables_and_a_late_size_update_are_refused() -> None:
    with pytest.raises(HpackError, match="out of range"):
        Decoder().decode(b"\xff\x00")  # index 127: no such entry
    with pytest.raises(HpackError, match="after a header field"):
        Decoder().decode(b"\x82\x20")  # :method GET, then a table size update
    with pytest.raises(HpackError, match="over the advertised limit"):
        Decoder(max_table_size=100).decode(b"\x3f\xe1\x1f")  # size update to 4096
    with pytest.raises(HpackError, match="truncated"):
        Decoder().decode(b"\x04\x05ab")  # a 5-byte :path with 2 bytes
