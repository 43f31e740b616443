"""SubscriptionGroupManager (org.apache.rocketmq.broker.subscription.SubscriptionGroupManager): the
subscription-group table, ``subscriptionGroup.json``.

:class:`SubscriptionGroupConfig` with the Java defaults and keys, TopicValidator.validateGroup
(:func:`validate_group`), and the manager: the system groups of ``init()``, explicit put/delete
(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP; written at once) and findSubscriptionGroupConfig,
which auto-creates a group a heartbeat names (autoCreateSubscriptionGroup, or a ``CID_RMQ_SYS_`` group with
enableCreateSysGroup) within the store's auto-create budget (``autoCreateMaxSubscriptionGroups``); such a group is a
derivable change, written within a second.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, fields

from engine.registry.clientlog import subscription_group_config as _java_text
from engine.registry.config_manager import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    KeyedConfigManager,
    StoreError,
    _get,
    _or_empty,
    _str_map,
)

log = logging.getLogger("engine.registry.store")

__all__ = ["CID_RMQ_SYS_PREFIX", "GROUP_MAX_LENGTH", "SYSTEM_CONSUMER_GROUPS", "SubscriptionGroupConfig",
           "SubscriptionGroupManager", "validate_group"]

#: Groups SubscriptionGroupManager#init creates at start (the last five with consumeBroadcastEnable, the default).
SYSTEM_CONSUMER_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
    "CID_RMQ_SYS_TRANS",
)
CID_RMQ_SYS_PREFIX = "CID_RMQ_SYS_"
GROUP_MAX_LENGTH = 120
_GROUP_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")


def validate_group(group) -> tuple[bool, str]:
    """TopicValidator.validateGroup: non-blank, only ``[%|a-zA-Z0-9_-]``, at most 120 characters."""
    if group is None or not str(group).strip():
        return False, "The specified group is blank."
    if not _GROUP_CHARS.fullmatch(group):
        return False, f"The specified group: {group}, contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    if len(group) > GROUP_MAX_LENGTH:
        return False, f"The specified group: {group}, is longer than group max length: {GROUP_MAX_LENGTH}"
    return True, ""


@dataclass
class SubscriptionGroupConfig:
    """SubscriptionGroupConfig with the defaults of PROTOCOL.md 6.12. ``to_dict`` uses Java keys."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    group_retry_policy: dict = field(default_factory=lambda: {"type": "CUSTOMIZED"})
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    subscription_data_set: list | None = None
    attributes: dict = field(default_factory=dict)

    _JAVA_KEYS = {
        "group_name": "groupName",
        "consume_enable": "consumeEnable",
        "consume_from_min_enable": "consumeFromMinEnable",
        "consume_broadcast_enable": "consumeBroadcastEnable",
        "consume_message_orderly": "consumeMessageOrderly",
        "retry_queue_nums": "retryQueueNums",
        "retry_max_times": "retryMaxTimes",
        "group_retry_policy": "groupRetryPolicy",
        "broker_id": "brokerId",
        "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
        "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
        "group_sys_flag": "groupSysFlag",
        "consume_timeout_minute": "consumeTimeoutMinute",
        "subscription_data_set": "subscriptionDataSet",
        "attributes": "attributes",
    }

    def __str__(self) -> str:
        """SubscriptionGroupConfig.toString() of 4.9.8, as Java's log lines print it; repr() stays Python's."""
        return _java_text(self)

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue  # fastjson omits nulls
            out[self._JAVA_KEYS[f.name]] = dict(value) if isinstance(value, dict) else value
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, d, path="$") -> "SubscriptionGroupConfig":
        if not isinstance(d, dict):
            raise StoreError(f"{path}: expected an object")
        name = _get(d, "groupName", str, None, path)
        if not name:
            raise StoreError(f"{path}.groupName: missing")
        policy = _get(d, "groupRetryPolicy", dict, None, path)
        subs = d.get("subscriptionDataSet")
        if subs is not None and not isinstance(subs, list):
            raise StoreError(f"{path}.subscriptionDataSet: expected an array")
        i32 = (INT32_MIN, INT32_MAX)
        i64 = (INT64_MIN, INT64_MAX)
        return cls(
            group_name=name,
            consume_enable=_get(d, "consumeEnable", bool, True, path),
            consume_from_min_enable=_get(d, "consumeFromMinEnable", bool, True, path),
            consume_broadcast_enable=_get(d, "consumeBroadcastEnable", bool, True, path),
            consume_message_orderly=_get(d, "consumeMessageOrderly", bool, False, path),
            retry_queue_nums=_get(d, "retryQueueNums", int, 1, path, *i32),
            retry_max_times=_get(d, "retryMaxTimes", int, 16, path, *i32),
            group_retry_policy=dict(policy) if policy is not None else {"type": "CUSTOMIZED"},
            broker_id=_get(d, "brokerId", int, 0, path, *i64),
            which_broker_when_consume_slowly=_get(d, "whichBrokerWhenConsumeSlowly", int, 1, path, *i64),
            notify_consumer_ids_changed_enable=_get(d, "notifyConsumerIdsChangedEnable", bool, True, path),
            group_sys_flag=_get(d, "groupSysFlag", int, 0, path, *i32),
            consume_timeout_minute=_get(d, "consumeTimeoutMinute", int, 15, path, *i32),
            subscription_data_set=list(subs) if subs is not None else None,
            attributes=_str_map(_or_empty(d.get("attributes")), f"{path}.attributes"),
        )


class SubscriptionGroupManager(KeyedConfigManager):
    """The subscription-group table (SubscriptionGroupManager): ``subscriptionGroup.json``, with the system
    groups of ``init()``."""

    FILE_NAME, TABLE_KEY, KEY_ATTR = "subscriptionGroup.json", "subscriptionGroupTable", "group_name"
    EXTRA = {"forbiddenTable": {}}

    def __init__(self, store: "Store"):
        super().__init__(store)
        for name in SYSTEM_CONSUMER_GROUPS:
            self.table[name] = SubscriptionGroupConfig(name)

    def _item_from_json(self, key, value, path):
        return SubscriptionGroupConfig.from_dict(value, path)

    def find(self, group: str, auto_create: bool, enable_create_sys_group: bool) -> tuple:
        """findSubscriptionGroupConfig: ``(config or None, created)``.

        A missing group is created with the defaults when auto-create is on, or when it is a ``CID_RMQ_SYS_``
        group and creating system groups is on, provided validateGroup accepts the name.
        """
        config = self.table.get(group)
        if config is not None:
            return config, False
        if not (auto_create or (enable_create_sys_group and group is not None
                                and group.startswith(CID_RMQ_SYS_PREFIX))):
            return None, False
        ok, _ = validate_group(group)
        if not ok:
            return None, False
        if not self._store.may_auto_create(self, group):
            return None, False
        config = SubscriptionGroupConfig(group)
        self.table[group] = config
        log.debug("auto-created subscription group %s", group)  # Java's line is the registry's (engine.registry.clientlog)
        self._changed(derivable=True)  # the next heartbeat of the group creates it again
        return config, True

    def load(self) -> None:
        system = dict(self.table)
        super().load()
        self.table = {**system, **self.table}  # Java: init() first, then the file's entries over them
