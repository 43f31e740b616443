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
    ``over`` is True once the file had more past the budget (``reason()`` says so, without the file's bytes)."""

    def __init__(self, path, max_ratio: Optional[int] = None, min_bytes: Optional[int] = None):
        super().__init__()
        self._raw = open(path, "rb")
        try:
            self.compressed = os.fstat(self._raw.fileno()).st_size
            self._gz = gzip.GzipFile(fileobj=self._raw, mode="rb")
        except BaseException:
            self._raw.close()
            raise
        self.max_ratio = int(GZIP_MAX_RATIO if max_ratio is None else max_ratio)
        self.min_bytes = int(GZIP_MIN_BYTES if min_bytes is None else min_bytes)
        self.budget = gzip_budget(self.compressed, self.max_ratio, self.min_bytes)
        self.read_bytes = 0
        self.over = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        room = self.budget - self.read_bytes
        if room <= 0:
            if not self.over and self._gz.read(1):  # one byte more: the file goes on past the budget
                self.over = True
            return 0
        with memoryview(b) as mv:
            n = self._gz.readinto(mv[:room]) or 0
        self.read_bytes += n
        return n

    def reason(self) -> str:
        return (f"decompressed past {self.budget:,} bytes ({self.max_ratio}:1 of its {self.compressed:,} gzip "
                f"bytes, at least {self.min_bytes:,}: a gzip bomb?); the rest of the file not read")

    def close(self):
        if not self.closed:
            try:
                self._gz.close()
            finally:
                self._raw.close()
        super().close()
