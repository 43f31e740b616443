# The monotonic clock the compiled modules read, inline where it is read (no module of its own): the clock
# ``time.monotonic()`` reads, without the Python call.
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC


cdef inline double monotonic() noexcept:
    """time.monotonic(): CLOCK_MONOTONIC in seconds."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9
