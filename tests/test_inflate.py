"""sources/inflate.py on its own: every call's output bounded, whatever one piece inflates to;
what a server sends whole read whole; a damaged or extended body refused."""

from __future__ import annotations

import zlib

import pytest

from analyzer.sources.inflate import STEP, CodingError, Inflater, codings


def _squeezed(data: bytes, wbits: int) -> bytes:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return squeeze.compress(data) + squeeze.flush()


def test_one_piece_that_inflates_to_64_mib_comes_out_a_step_at_a_time():
    bomb = _squeezed(b" " * (64 * 2**20), 31)
    inflater = Inflater("gzip")
    sizes = [len(piece) for piece in inflater.feed(bomb)]  # the whole bomb in one piece
    inflater.end()
    assert max(sizes) <= STEP and sum(sizes) == 64 * 2**20


@pytest.mark.parametrize(
    ("header", "wbits"),
    [("gzip", 31), ("x-gzip", 31), ("deflate", 15), ("deflate", -15), ("identity", 0), ("", 0)],
)
def test_what_a_server_sends_is_read_whole_in_any_pieces(header, wbits):
    data = b'[{"id": "' + bytes(range(48, 123)) * 500 + b'"}]'
    body = _squeezed(data, wbits) if wbits else data
    inflater = Inflater(header)
    out = b"".join(
        piece for i in range(0, len(body), 7) for piece in inflater.feed(body[i : i + 7])
    )
    inflater.end()
    assert out == data


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (_squeezed(b"[]", 31)[:-4], "gzip data that ends before its end"),
        (_squeezed(b"[]", 31) + b"more", "bytes after the end of its gzip data"),
        (b"not gzip at all", "gzip data that does not inflate"),
    ],
)
def test_a_damaged_body_is_refused(body, problem):
    inflater = Inflater("gzip")
    with pytest.raises(CodingError, match=problem):
        for _ in inflater.feed(body):
            pass
        inflater.end()


def test_codings_in_the_order_applied_without_identity():
    assert codings(" GZip , identity,deflate ") == ["gzip", "deflate"]
    with pytest.raises(CodingError, match="more than one coding"):
        Inflater("deflate, gzip")
