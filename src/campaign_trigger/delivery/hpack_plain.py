"""A minimal HPACK encoder for our own requests: no dynamic table, no Huffman.

h2's encoder (the ``hpack`` package, pure Python) was the largest cost of an APNs
request in profiles: it searches its dynamic table for every header and Huffman-codes
every new value. Our requests repeat a few constant headers and carry three values
unique to the request, so this encoder writes every header as a "literal without
indexing" (RFC 7541 §6.2.2), using the static table for names, and caches the encoding
of each repeated header. The first header block starts with a dynamic table size
update to 0 (§6.3), so the peer's decoder never expects table entries from us.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

_STATIC_NAMES: Final[dict[bytes, int]] = {
    b":authority": 1,
    b":method": 2,
    b":path": 4,
    b":scheme": 6,
    b":status": 8,
    b"authorization": 23,
    b"content-length": 28,
    b"content-type": 31,
}
_FULLY_INDEXED: Final[dict[tuple[bytes, bytes], bytes]] = {
    (b":method", b"GET"): b"\x82",
    (b":method", b"POST"): b"\x83",
    (b":scheme", b"http"): b"\x86",
    (b":scheme", b"https"): b"\x87",
}
_CACHED_NAMES: Final = frozenset(
    {
        b":authority",
        b":method",
        b":scheme",
        b"authorization",
        b"apns-topic",
        b"apns-push-type",
        b"apns-priority",
        b"apns-expiration",
        b"content-type",
    }
)


def _integer(value: int, prefix_bits: int, first_byte_flags: int = 0) -> bytes:
    """RFC 7541 §5.1 integer with an N-bit prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte_flags | value])
    out = bytearray([first_byte_flags | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _integer(len(data), 7) + data  # H bit 0: no Huffman


def encode_header(name: bytes, value: bytes) -> bytes:
    """One header as a literal without indexing (or fully indexed if static)."""
    indexed = _FULLY_INDEXED.get((name, value))
    if indexed is not None:
        return indexed
    index = _STATIC_NAMES.get(name)
    if index is not None:
        return _integer(index, 4) + _string(value)
    return b"\x00" + _string(name) + _string(value)


class PlainEncoder:
    """Drop-in for ``hpack.Encoder`` as h2 uses it (``encode`` and ``header_table_size``)."""

    def __init__(self) -> None:
        self.header_table_size = 0  # h2 sets the peer's limit here; we never use a table
        self._first_block = True
        self._cache: dict[tuple[bytes, bytes], bytes] = {}

    def encode(self, headers: Iterable[tuple[bytes, bytes]], huffman: bool = False) -> bytes:
        """The header block for ``headers`` (names lower-case bytes, values bytes)."""
        parts: list[bytes] = []
        if self._first_block:
            parts.append(b"\x20")  # dynamic table size update: 0
            self._first_block = False
        cache = self._cache
        for name, value in headers:
            key = (bytes(name), bytes(value))
            encoded = cache.get(key)
            if encoded is None:
                encoded = encode_header(*key)
                if key[0] in _CACHED_NAMES and len(cache) < 1024:
                    cache[key] = encoded
            parts.append(encoded)
        return b"".join(parts)
