"""Decode an HTTP answer's body by its Content-Encoding with a bound on every call's output.

A hostile server's `Content-Encoding: gzip, gzip` of 3,479 bytes inflates to about 2 GiB in
one decode call of an HTTP client (httpx inflates each layer whole), before any cap on the
answer can look at it. Here each call produces at most STEP bytes, so the reader's cap holds on
every byte produced. Only what a dstack server sends is read (its uvicorn/FastAPI stack sends
`identity`, or one `gzip` or `deflate` when asked): any other coding, or more than one, is
refused by name before a byte of the body is read.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

STEP = 1024 * 1024  # the most one inflate call may produce
ACCEPTED = "gzip, deflate"  # what the reader asks for (Accept-Encoding)
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class CodingError(ValueError):
    """The body cannot be decoded (the message says why, never quoting the body)."""


def codings(header: str) -> list[str]:
    """The codings a Content-Encoding header names, in the order they were applied,
    `identity` left out."""
    named = [part.strip().lower() for part in header.split(",")]
    return [name for name in named if name and name != "identity"]


def _shown(value: str) -> str:
    """A header's value as an error may quote it: escaped (repr), its first 40 characters."""
    return repr(value[:40]) + ("…" if len(value) > 40 else "")


class Inflater:
    """One answer's decoder: `feed` each raw piece as it arrives, then `end`."""

    def __init__(self, header: str) -> None:
        applied = codings(header)
        if len(applied) > 1:
            raise CodingError(
                f"answered with Content-Encoding {_shown(header.strip())}: more than one "
                "coding (only identity, gzip or deflate is read)"
            )
        if applied and applied[0] not in _WBITS:
            raise CodingError(
                f"answered with Content-Encoding {_shown(applied[0])} "
                "(only identity, gzip or deflate is read)"
            )
        self.coding = applied[0] if applied else None
        self._inflate = zlib.decompressobj(_WBITS[self.coding]) if self.coding else None
        self._first = True

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of `data`, in pieces of at most STEP bytes."""
        if self._inflate is None:
            if data:
                yield data
            return
        if self._first and data and self.coding == "deflate":
            self._first = False
            # RFC 9110 deflate is zlib-wrapped; some servers send raw deflate (httpx reads both)
            if (data[0] & 0x0F) != 8 or int.from_bytes(data[:2]) % 31:
                self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
        while True:
            if self._inflate.eof and (data or self._inflate.unused_data):
                raise CodingError(f"sent bytes after the end of its {self.coding} data")
            if self._inflate.eof:
                return
            try:
                piece = self._inflate.decompress(data, STEP)
            except zlib.error as error:
                raise CodingError(
                    f"sent {self.coding} data that does not inflate ({error})"
                ) from None
            data = self._inflate.unconsumed_tail
            if piece:
                yield piece
            if not data and len(piece) < STEP and not self._inflate.unused_data:
                return  # all taken, nothing held back by the bound, nothing after the end

    def end(self) -> None:
        """Refuse a compressed body that stopped before its end (a cut answer)."""
        if self._inflate is not None and not self._inflate.eof:
            raise CodingError(f"sent {self.coding} data that ends before its end")
