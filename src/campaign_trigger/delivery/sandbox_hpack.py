"""HPACK header decoding (RFC 7541) for the sandbox's HTTP/2 server.

Why not ``hpack.Decoder``: it decodes Huffman strings bit by bit in Python and cost
~80 µs per APNs request header block in profiles, more than the rest of a request.
This decoder walks Huffman strings a byte at a time through a state table built once
from the code of RFC 7541 Appendix B (256 tree nodes x 256 byte values), keeps the
dynamic table as a list of decoded ``(name, value)`` pairs, and otherwise follows the
RFC to the letter: integer and string literals, indexed fields, literals with and
without indexing, never-indexed literals, table size updates (only at the start of a
block and within the limit we advertised), padding and EOS rules. Any violation raises
:class:`HpackError`, which the connection turns into a ``COMPRESSION_ERROR``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

Header = tuple[bytes, bytes]

STATIC_TABLE: Final[tuple[Header, ...]] = tuple(HeaderTable.STATIC_TABLE)
_STATIC_COUNT: Final = len(STATIC_TABLE)
_ENTRY_OVERHEAD: Final = 32  # RFC 7541 §4.1
_EOS: Final = 256
_CACHE_LIMIT: Final = 2048
# Clients re-send some long values as never-indexed Huffman literals on every request
# (h2 does so for ``authorization``: a 200-byte JWT); decoded once, looked up after.
_decoded: dict[bytes, bytes] = {}


class HpackError(ValueError):
    """The header block cannot be decoded (a connection error: COMPRESSION_ERROR)."""


def _huffman_tree() -> tuple[list[list[int]], list[int]]:
    """Tree nodes as [child0, child1] (a child >= 0 is a node, < 0 is -(symbol + 1))."""
    nodes: list[list[int]] = [[0, 0]]
    for symbol, (code, length) in enumerate(zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=True)):
        node = 0
        for shift in range(length - 1, -1, -1):
            bit = (code >> shift) & 1
            if shift == 0:
                nodes[node][bit] = -(symbol + 1)
            else:
                if nodes[node][bit] == 0:
                    nodes.append([0, 0])
                    nodes[node][bit] = len(nodes) - 1
                node = nodes[node][bit]
    # a node is a valid place to stop (padding) if reached from the root by at most
    # seven 1-bits: the most significant bits of EOS (§5.2)
    ones: list[int] = []
    node = 0
    for _ in range(7):
        ones.append(node)
        node = nodes[node][1]
    ones.append(node)
    return nodes, ones


@lru_cache(maxsize=1)
def _byte_table() -> tuple[list[tuple[int, bytes] | None], frozenset[int]]:
    """``table[state << 8 | byte]`` = (next state << 8, bytes emitted), None if EOS is decoded;
    and the accepting end states (shifted the same way)."""
    nodes, ones = _huffman_tree()
    table: list[tuple[int, bytes] | None] = []
    for state in range(len(nodes)):
        for byte in range(256):
            node, out, ok = state, bytearray(), True
            for shift in range(7, -1, -1):
                child = nodes[node][(byte >> shift) & 1]
                if child < 0:
                    symbol = -child - 1
                    if symbol == _EOS:
                        ok = False
                        break
                    out.append(symbol)
                    node = 0
                else:
                    node = child
            table.append((node << 8, bytes(out)) if ok else None)
    return table, frozenset(node << 8 for node in ones)


def huffman_decode(data: bytes) -> bytes:
    """Decode a Huffman-coded string literal (§5.2)."""
    table, accepting = _byte_table()
    state = 0
    out = bytearray()
    try:
        for byte in data:
            state, emitted = table[state | byte]  # type: ignore[misc]
            out += emitted
    except TypeError:  # the None of a decoded EOS
        raise HpackError("EOS in a Huffman string") from None
    if state not in accepting:
        raise HpackError("bad Huffman padding")
    return bytes(out)


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """An N-bit-prefix integer starting at ``data[pos]`` (§5.1); (value, next position)."""
    limit = (1 << prefix_bits) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise HpackError("truncated integer")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise HpackError("integer too large")


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos >= len(data):
        raise HpackError("truncated string")
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 7)
    end = pos + length
    if end > len(data):
        raise HpackError("truncated string")
    raw = data[pos:end]
    if not huffman:
        return raw, end
    decoded = _decoded.get(raw)
    if decoded is None:
        decoded = huffman_decode(raw)
        if len(_decoded) >= _CACHE_LIMIT:
            _decoded.clear()
        _decoded[raw] = decoded
    return decoded, end


class Decoder:
    """One connection's HPACK decoder (state: the dynamic table)."""

    def __init__(self, *, max_table_size: int = 4096, max_header_list_size: int = 65536) -> None:
        self.max_allowed_table_size = max_table_size  # SETTINGS_HEADER_TABLE_SIZE we sent
        self.max_header_list_size = max_header_list_size
        self._table: list[Header] = []  # newest first
        self._size = 0
        self._max_size = max_table_size

    def _entry(self, index: int) -> Header:
        if index <= 0:
            raise HpackError("index 0")
        if index <= _STATIC_COUNT:
            return STATIC_TABLE[index - 1]
        dynamic = index - _STATIC_COUNT - 1
        if dynamic >= len(self._table):
            raise HpackError(f"index {index} out of range")
        return self._table[dynamic]

    def _add(self, header: Header) -> None:
        size = _ENTRY_OVERHEAD + len(header[0]) + len(header[1])
        if size > self._max_size:
            self._table.clear()
            self._size = 0
            return
        self._table.insert(0, header)
        self._size += size
        self._shrink()

    def _shrink(self) -> None:
        while self._size > self._max_size:
            name, value = self._table.pop()
            self._size -= _ENTRY_OVERHEAD + len(name) + len(value)

    def decode(self, data: bytes) -> list[Header]:
        """The header list of one complete header block."""
        headers: list[Header] = []
        pos, end = 0, len(data)
        list_size = 0
        fields_seen = False
        while pos < end:
            byte = data[pos]
            if byte & 0x80:  # indexed field (§6.1)
                index, pos = _integer(data, pos, 7)
                header = self._entry(index)
            elif byte & 0x40:  # literal with incremental indexing (§6.2.1)
                index, pos = _integer(data, pos, 6)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = _string(data, pos)
                value, pos = _string(data, pos)
                header = (name, value)
                self._add(header)
            elif byte & 0x20:  # dynamic table size update (§6.3)
                if fields_seen:
                    raise HpackError("table size update after a header field")
                size, pos = _integer(data, pos, 5)
                if size > self.max_allowed_table_size:
                    raise HpackError("table size update over the advertised limit")
                self._max_size = size
                self._shrink()
                continue
            else:  # literal without indexing / never indexed (§6.2.2, §6.2.3)
                index, pos = _integer(data, pos, 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = _string(data, pos)
                value, pos = _string(data, pos)
                header = (name, value)
            fields_seen = True
            list_size += _ENTRY_OVERHEAD + len(header[0]) + len(header[1])
            if list_size > self.max_header_list_size:
                raise HpackError("header list too large")
            headers.append(header)
        return headers
