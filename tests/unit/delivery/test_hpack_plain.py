"""Our HPACK encoder's output decodes, with the reference decoder, to the same headers."""

from __future__ import annotations

from hpack import Decoder

from campaign_trigger.delivery.hpack_plain import PlainEncoder, encode_header

HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"https"),
    (b":authority", b"api.push.apple.com"),
    (b":path", b"/3/device/" + b"ab" * 100),
    (b"authorization", b"bearer " + b"x" * 300),
    (b"apns-topic", b"com.example.app"),
    (b"apns-id", b"123e4567-e89b-12d3-a456-426614174000"),
    (b"x-empty", b""),
]


def test_blocks_round_trip_through_the_reference_decoder() -> None:
    encoder, decoder = PlainEncoder(), Decoder()
    for _ in range(3):
        assert decoder.decode(encoder.encode(HEADERS), raw=True) == HEADERS
    assert decoder.header_table_size == 0


def test_first_block_shrinks_the_dynamic_table_and_later_ones_do_not() -> None:
    encoder = PlainEncoder()
    assert encoder.encode(HEADERS).startswith(b"\x20")
    assert not encoder.encode(HEADERS).startswith(b"\x20")


def test_long_values_use_multi_byte_lengths() -> None:
    value = b"v" * 1000
    encoded = encode_header(b"x-long", value)
    assert Decoder().decode(b"\x20" + encoded, raw=True) == [(b"x-long", value)]
    assert encode_header(b":method", b"POST") == b"\x83"
