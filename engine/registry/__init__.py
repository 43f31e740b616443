"""Client management over one channel table, named as in RocketMQ's broker.

``client_registry.ClientRegistry`` is the facade the broker uses; it composes ``producer_manager``
(ProducerManager), ``consumer_manager`` (ConsumerManager, ConsumerGroupInfo), ``client_channel``
(ClientChannelInfo), the persisted tables over ``config_manager`` (``topic_config_manager``,
``subscription_group_manager``, ``consumer_offset_manager``; ``store.Store`` composes the three)
and ``rebalance`` (RebalanceLockManager).
``sql92`` checks SQL92 filters, ``clientlog`` writes Java's log lines; the channel table the managers share (slots,
their columns, memberships, member arrays, the expiry scan), the string pool of client ids and addresses, the
expiry scan over plain columns and the heartbeat digest are compiled (pyx/registry/) with twins
``_channel_table_py``, ``_intern_py``, ``_expiry_py`` and ``_digest_py``; so are the heartbeat rules of the common
requests (``_rules``), whose twin is ``client_registry``'s Python path.
"""


def __getattr__(name):
    # lazy, so that importing one manager does not import the whole facade
    if name == "ClientRegistry":
        from engine.registry.client_registry import ClientRegistry

        return ClientRegistry
    raise AttributeError(f"module 'engine.registry' has no attribute {name!r}")
