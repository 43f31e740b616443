"""Pure-Python twin of ``engine._digest``: a 64-bit digest of what in a heartbeat can change the registry.

The registry's fast path answers a heartbeat that repeats the previous one on the same connection, when nothing
it depends on changed in between, by refreshing timestamps only (see ``engine.registry``). "Repeats" is decided
on this digest, which covers exactly the fields the registration rules read (PROTOCOL.md 6.3, 6.7, 6.8, 5.4):
client id, fingerprint, withoutSub, the request's language and version, each producer group, and each consumer's
group, consume type, message model, consume-from-where, unit mode and, per subscription, topic and subVersion.
The expression, tags and codes are left out on purpose: updateSubscription ignores them unless subVersion grows,
which the digest sees.

Algorithm (the native module computes the same value): FNV-1a over 64-bit words, then the splitmix64 finalizer.
Words are the Python ``hash()`` of each string (cached on the str object), integers as they are, enums by
ordinal (None: -1), booleans 0/1, and each list's length before its items. The result is a signed int64. It is
stable within one process (string hashes are randomized per process), which is all the registry needs.
"""

__all__ = ["heartbeat_digest"]

_MASK = (1 << 64) - 1
_OFFSET = 0xCBF29CE484222325
_PRIME = 0x100000001B3


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _ordinal(e):
    return -1 if e is None else _int64(e)


def _int64(value) -> int:
    value = int(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise OverflowError("Python int too large to convert to C long")  # the native module's error
    return value


def heartbeat_digest(hb, language, version) -> int:
    """Digest of ``hb`` as received with the request header's ``language`` and ``version``."""
    words = [hash(hb.client_id), _int64(hb.fingerprint), 1 if hb.without_sub else 0, _ordinal(language),
             _int64(version)]
    producers = hb.producers
    words.append(len(producers))
    for p in producers:
        words.append(hash(p.group))
    consumers = hb.consumers
    words.append(len(consumers))
    for c in consumers:
        subs = c.subscriptions
        words += (hash(c.group), _ordinal(c.consume_type), _ordinal(c.message_model),
                  _ordinal(c.consume_from_where), 1 if c.unit_mode else 0, len(subs))
        for s in subs:
            words += (hash(s.topic), _int64(s.sub_version))
    h = _OFFSET
    for w in words:
        h = ((h ^ (w & _MASK)) * _PRIME) & _MASK
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _MASK
    h ^= h >> 31
    return h - (1 << 64) if h >> 63 else h
