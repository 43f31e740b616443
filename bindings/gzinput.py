"""Gzipped scan inputs (broker logs, captures) read within a budget of decompressed bytes.

A ``.gz`` from elsewhere is untrusted: deflate expands up to ~1,032:1, so a few MB of gzip cost gigabytes of
decompression and of parsing (a 3.8 MB ``.pcap.gz`` held > 4 GB). A file is read up to
``max(GZIP_MIN_BYTES, GZIP_MAX_RATIO x its compressed size)`` decompressed bytes; past it the rest of the file is
not read and the reader names it as damage (``gzip_budget``), the other inputs are read on. Real logs and captures
compress 5-50:1, far below the ratio.
"""
from __future__ import annotations

import gzip
import io
import os
import zlib
from typing import Optional

#: decompressed bytes a .gz input may give per compressed byte ...
GZIP_MAX_RATIO = 200
#: ... and at least this many whatever its size (a small file is never cut)
GZIP_MIN_BYTES = 64 << 20


def gzip_budget(compressed: int, max_ratio: Optional[int] = None, min_bytes: Optional[int] = None) -> int:
    """Decompressed bytes a gzip file of ``compressed`` bytes may give (None: the module's constants)."""
    return max(int(GZIP_MIN_BYTES if min_bytes is None else min_bytes),
               int(GZIP_MAX_RATIO if max_ratio is None else max_ratio) * int(compressed))


class BoundedGzip(io.RawIOBase):
    """A gzip file's decompressed bytes up to ``budget`` (default :func:`gzip_budget` of its size), then EOF;
    ``over`` is True once the file had more past the budget (``reason()`` says so, without the file's bytes).

    Decompressed with zlib directly rather than :class:`gzip.GzipFile`: a cut file (a copy taken while it was
    written, a truncated download) gives every byte before the cut, then EOFError at the next read. GzipFile raises
    in the read that reaches the cut and drops what that read had decompressed, so a cut file read in large chunks
    gave nothing at all. Several members (``cat a.gz b.gz``) are read one after the other, as gzip does; zero
    padding after the last member is ignored; a file that is not gzip raises :class:`gzip.BadGzipFile`."""

    _CHUNK = 1 << 16
    #: compressed bytes given to the decompressor at a time, and the most one call returns: memory stays at a few
    #: hundred KiB whatever the ratio, and each byte is copied a bounded number of times whatever the read sizes
    _SLICE = 4096
    _OUT = 1 << 18

    def __init__(self, path, max_ratio: Optional[int] = None, min_bytes: Optional[int] = None):
        super().__init__()
        self._raw = open(path, "rb")
        try:
            self.compressed = os.fstat(self._raw.fileno()).st_size
        except BaseException:
            self._raw.close()
            raise
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._fresh = True       # the current decompressor has been given nothing yet
        self._started = False    # a member has given output or ended (a bad header is then damage, not "not gzip")
        self._cut = False        # the file ended inside a member: EOFError once the bytes before it are read
        self._done = False
        self._in, self._in_off = b"", 0    # compressed bytes read from the file, and how far they were given
        self._out, self._out_off = b"", 0  # decompressed bytes, and how far they were returned
        self.max_ratio = int(GZIP_MAX_RATIO if max_ratio is None else max_ratio)
        self.min_bytes = int(GZIP_MIN_BYTES if min_bytes is None else min_bytes)
        self.budget = gzip_budget(self.compressed, self.max_ratio, self.min_bytes)
        self.read_bytes = 0
        self.over = False

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """Decompress until there is output to return; False at the end of the last member (or at a cut)."""
        while not self._done:
            if self._in_off >= len(self._in) and not self._z.unconsumed_tail:
                self._in, self._in_off = self._raw.read(self._CHUNK), 0
                if not self._in:
                    self._cut = not (self._z.eof or self._fresh)  # else: the last member's end, or an empty file
                    self._done = True
                    break
            if self._z.eof:  # bytes after a member: zero padding, or the next member
                if not self._in[self._in_off:].strip(b"\0"):
                    self._in_off = len(self._in)
                    continue
                self._z, self._fresh = zlib.decompressobj(16 + zlib.MAX_WBITS), True
            data = self._z.unconsumed_tail  # what the last call left for want of output room (<= one slice)
            if not data:
                data = self._in[self._in_off:self._in_off + self._SLICE]
                self._in_off += len(data)
            try:
                out = self._z.decompress(data, self._OUT)
            except zlib.error:
                if not self._started:
                    raise gzip.BadGzipFile("not a gzip file") from None
                raise
            self._fresh = False
            if self._z.eof:
                self._started = True
                self._in_off -= len(self._z.unused_data)  # the next member's bytes are read again from there
            if out:
                self._started = True
                self._out, self._out_off = out, 0
                return True
        return False

    def readinto(self, b) -> int:
        room = self.budget - self.read_bytes
        if self._out_off >= len(self._out) and not self._fill():
            if self._cut and room > 0:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            return 0
        if room <= 0:  # the file goes on past the budget
            self.over = True
            return 0
        with memoryview(b) as mv:
            n = min(room, len(mv), len(self._out) - self._out_off)
            mv[:n] = self._out[self._out_off:self._out_off + n]
        self._out_off += n
        self.read_bytes += n
        return n

    def reason(self) -> str:
        return (f"decompressed past {self.budget:,} bytes ({self.max_ratio}:1 of its {self.compressed:,} gzip "
                f"bytes, at least {self.min_bytes:,}: a gzip bomb?); the rest of the file not read")

    def close(self):
        if not self.closed:
            self._raw.close()
        super().close()
