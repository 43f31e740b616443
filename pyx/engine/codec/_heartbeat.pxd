# The heartbeat model's C layout, for the modules that cimport it (engine.registry._rules reads the fields of
# decoded heartbeats directly). Defined in pyx/codec/_heartbeat.pyx. The .pxd files live under pyx/engine/, laid out
# as the engine package (with __init__.pxd markers), where Cython finds them by module name on the include path pyx/.
from libc.stdint cimport int32_t, int64_t


cdef class _Model:
    cdef bint _same(self, _Model other) except -1


cdef class SubscriptionData(_Model):
    cdef readonly object topic
    cdef readonly object sub_string
    cdef readonly tuple tags
    cdef readonly tuple codes
    cdef readonly int64_t sub_version
    cdef readonly object expression_type
    cdef readonly bint class_filter_mode
    cdef bint _same(self, _Model other) except -1


cdef class ProducerData(_Model):
    cdef readonly object group
    cdef bint _same(self, _Model other) except -1


cdef class ConsumerData(_Model):
    cdef readonly object group
    cdef readonly object consume_type
    cdef readonly object message_model
    cdef readonly object consume_from_where
    cdef readonly bint unit_mode
    cdef readonly tuple subscriptions
    cdef bint _same(self, _Model other) except -1


cdef class HeartbeatData(_Model):
    cdef readonly object client_id
    cdef readonly tuple producers
    cdef readonly tuple consumers
    cdef readonly int32_t fingerprint
    cdef readonly bint without_sub
    cdef bint _same(self, _Model other) except -1
