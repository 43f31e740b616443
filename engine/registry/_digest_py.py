"""Pure-Python twin of ``engine.registry._digest``: a 64-bit digest of what in a heartbeat can change the registry.

The registry's fast path answers a heartbeat that repeats the previous one on the same connection, when nothing
it depends on changed in between, by refreshing timestamps only (see ``engine.registry.client_registry``). "Repeats" is decided
on this digest, which covers exactly the fields the registration rules read (PROTOCOL.md 6.3, 6.7, 6.8, 5.4):
client id, fingerprint, withoutSub, the request's language and version, each producer group, and each consumer's
group, consume type, message model, consume-from-where, unit mode and, per subscription, topic and subVersion.
The expression, tags and codes are left out on purpose: updateSubscription ignores them unless subVersion grows,
which the digest sees.

The sets of a heartbeat (producer groups, consumers, each consumer's subscriptions) are digested as sets: a Java
client sends them in HashSet order, which changes between heartbeats of the same registration, and a reordered
heartbeat changes nothing (every rule is set-based), so it must take the fast path too. A set whose keys (group,
topic) are distinct is the wrapping sum of its elements' finalized digests; when two keys' hashes are equal (a
duplicate, whose order decides which one wins, or a collision) the set is digested in order instead, and a mode
word says which was used. Producer groups are a multiset sum either way (registering one twice is a no-op).

Algorithm (the native module computes the same value): FNV-1a over 64-bit words, then the splitmix64 finalizer.
Words are the Python ``hash()`` of each string (cached on the str object), integers as they are, enums by
ordinal (None: -1), booleans 0/1, and each set's length beside its digest. The result is a signed int64. It is
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


def _fnv(words, h=_OFFSET) -> int:
    for w in words:
        h = ((h ^ (w & _MASK)) * _PRIME) & _MASK
    return h


def _fmix(h: int) -> int:
    """splitmix64's finalizer (64-bit)."""
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _MASK
    return h ^ (h >> 31)


def _set_words(keys, elements) -> tuple:
    """(mode, digest) of a set given its elements' keys and digests: 1 and the order-free sum when the keys' hashes
    are distinct, 2 and the ordered FNV otherwise."""
    if len(set(keys)) == len(keys):
        return 1, sum(_fmix(e) for e in elements) & _MASK
    return 2, _fnv(elements)


def heartbeat_digest(hb, language, version) -> int:
    """Digest of ``hb`` as received with the request header's ``language`` and ``version``."""
    words = [hash(hb.client_id), _int64(hb.fingerprint), 1 if hb.without_sub else 0, _ordinal(language),
             _int64(version)]
    producers = hb.producers
    words += (len(producers), sum(_fmix(hash(p.group) & _MASK) for p in producers) & _MASK)
    keys, elements = [], []
    for c in hb.consumers:
        subs = c.subscriptions
        topics = [hash(s.topic) & _MASK for s in subs]
        mode, digest = _set_words(topics, [_fnv((t, _int64(s.sub_version))) for t, s in zip(topics, subs)])
        group = hash(c.group) & _MASK
        keys.append(group)
        elements.append(_fnv((group, _ordinal(c.consume_type), _ordinal(c.message_model),
                              _ordinal(c.consume_from_where), 1 if c.unit_mode else 0, len(subs), mode, digest)))
    words += (len(elements),) + _set_words(keys, elements)
    h = _fmix(_fnv(words))
    return h - (1 << 64) if h >> 63 else h
