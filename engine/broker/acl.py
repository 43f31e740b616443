"""ACL in RocketMQ's plain_acl.yml form: accounts with accessKey/secretKey/admin, HMAC-SHA1 request signatures.

The signature every real client computes (Java AclClientRPCHook + AclUtils, the C++ ClientRPCHook, ali-ons
channel.js) is ``base64(HMAC-SHA1(secretKey, concat(values of the ext fields sorted by key, Signature excluded)
+ body))``. The clients add ``AccessKey`` (and the C++ client and ali-ons ``OnsChannel``) before signing, so those
values are part of the signed text. A null ext value is skipped, as ali-ons skips undefined header fields.

A request that fails the check gets NO_PERMISSION with RocketMQ's message (PlainPermissionManager) and never
reaches its processor. Secrets never appear in logs, reprs or error messages.

Checks, in PlainPermissionManager.validate's order: the global white list (no signature needed), a known
AccessKey, the account's white list (no signature needed), the signature, then checkPerm: admin codes need an admin
account, and every resource the request names (PlainAccessValidator.parse) needs its permission. Resources are
topics and, for groups, the group's retry topic (``%RETRY%group``); an account's ``topicPerms``/``groupPerms``
(``name=PUB|SUB``) grant them one by one, ``defaultTopicPerm``/``defaultGroupPerm`` the rest (DENY when unset).
An admin account without per-resource permissions may use every resource.

RocketMQ 5.x clients (the gRPC endpoint, engine.broker.grpc_endpoint) sign differently: every call carries the metadata
``x-mq-date-time`` (e.g. ``20261126T141200Z``) and ``authorization: MQv2-HMAC-SHA1 Credential=<AccessKey>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secretKey, the x-mq-date-time value)>`` (the 5.x SDKs'
Signature / the acl module's AuthorizationHeader of RocketMQ 5.0-5.2). :meth:`AclValidator.check_grpc` checks it
against the same accounts, in PlainPermissionManager.validate's order, and the resources a gRPC request names
(engine.broker.grpc_endpoint's ``acl_resources``: PlainAccessResource.parse of a protobuf request) against the same
permissions. Neither RocketMQ version checks the time itself (the Python 5.1.2 client even writes its local time
with a ``Z``), so neither does this one: a captured signature stays valid, as with the remoting scheme.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.codec._heartbeat_py import DEFAULT_MAX_ELEMENTS
from engine.codec.errors import RemotingError, echo
from engine.codec.enums import RequestCode

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"

#: Request codes that need an admin account (acl Permission.ADMIN_CODE): UPDATE_AND_CREATE_TOPIC,
#: UPDATE_BROKER_CONFIG, DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP.
ADMIN_CODES = frozenset({17, 25, 215, 200, 207})

#: Permission bits (acl Permission.java).
DENY, ANY, PUB, SUB = 1, 2, 4, 8
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
_PERM_NAMES = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}


def parse_perm(text) -> int:
    """Permission.parsePermFromString: PUB, SUB, PUB|SUB, SUB|PUB or DENY; anything else (or none) is DENY."""
    return DENY if text is None else _PERM_NAMES.get(str(text).strip(), DENY)


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def retry_topic(group):
    return None if group is None else RETRY_GROUP_TOPIC_PREFIX + group


def _resource_name(resource: str) -> str:
    """PlainAccessResource.printStr: ``group:<group>`` for a retry topic, else ``topic:<topic>`` (echoed)."""
    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return "group:" + echo(resource[len(RETRY_GROUP_TOPIC_PREFIX):])
    return "topic:" + echo(resource)


def request_resources(code: int, ext: dict, body, max_heartbeat_elements: int = DEFAULT_MAX_ELEMENTS) -> dict:
    """PlainAccessValidator.parse: the resources a request names and the permission each needs.

    Later entries replace earlier ones for the same resource, as in Java's map. Raises engine.HeartbeatError for a
    HEART_BEAT body that does not decode, or decodes to more than ``max_heartbeat_elements`` elements (the
    broker's maxHeartbeatElements; the request is refused: its resources cannot be known).
    """
    out: dict = {}

    def add(resource, perm):
        if resource is not None:
            out[resource] = perm

    get = ext.get
    if code == RequestCode.SEND_MESSAGE:
        add(get("topic"), PUB)
    elif code == 310:  # SEND_MESSAGE_V2: the short header names
        add(get("b"), PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        add(get("originTopic"), PUB)
        add(retry_topic(get("group")), SUB)
    elif code == RequestCode.PULL_MESSAGE:
        add(get("topic"), SUB)
        add(retry_topic(get("consumerGroup")), SUB)
    elif code == RequestCode.QUERY_MESSAGE:
        add(get("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        from engine import decode_heartbeat  # the facade's native or twin decoder

        for consumer in decode_heartbeat(bytes(body or b""), max_heartbeat_elements).consumers:
            add(retry_topic(consumer.group), SUB)
            for sub in consumer.subscriptions:
                add(sub.topic, SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        add(retry_topic(get("consumerGroup")), SUB)
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        add(retry_topic(get("consumerGroup")), SUB)
        add(get("topic"), SUB)
    return out


class AclError(RemotingError, ValueError):
    """The ACL file is malformed (the message names the line), or a request failed the check."""


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    admin: bool = False
    white_remote_address: str = ""
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    #: (resource, perm) pairs from topicPerms and groupPerms (groups as their retry topics); empty: none given
    resource_perms: tuple = ()

    def __repr__(self) -> str:  # the secret stays out of every repr
        return f"Account(access_key={self.access_key!r}, admin={self.admin})"


def sign(secret_key: str, ext_fields: dict | None, body: bytes | None) -> str:
    """The RocketMQ ACL signature of a request (see the module docstring)."""
    ext = ext_fields or {}
    text = "".join(v for k, v in sorted(ext.items(), key=lambda kv: kv[0]) if k != SIGNATURE and v is not None)
    data = text.encode("utf-8") + (body or b"")
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), data, hashlib.sha1).digest()).decode("ascii")


#: the 5.x SDKs' signature scheme (gRPC metadata keys, the method name of the authorization value)
GRPC_AUTHORIZATION = "authorization"
GRPC_DATE_TIME = "x-mq-date-time"
GRPC_SIGN_METHOD = "MQv2-HMAC-SHA1"
#: the status kinds of :meth:`AclValidator.check_grpc` (apache.rocketmq.v2.Code names)
UNAUTHORIZED, FORBIDDEN = "UNAUTHORIZED", "FORBIDDEN"


def grpc_signature(secret_key: str, date_time: str) -> str:
    """The Signature a 5.x client sends: hex HMAC-SHA1 of the ``x-mq-date-time`` value under the secret key."""
    return hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).hexdigest()


def grpc_authorization(access_key: str, secret_key: str, date_time: str) -> str:
    """The ``authorization`` metadata value a 5.x client sends with ``x-mq-date-time: date_time``."""
    return (f"{GRPC_SIGN_METHOD} Credential={access_key}, SignedHeaders={GRPC_DATE_TIME}, "
            f"Signature={grpc_signature(secret_key, date_time)}")


def parse_grpc_authorization(header: str) -> tuple:
    """``(access_key, signature bytes or None)`` of an ``authorization`` value, as RocketMQ's AuthorizationHeader
    reads it: the method word, then ``key=value`` items split on commas; ``Credential``'s part before the first
    ``/`` is the AccessKey, ``Signature`` is hex; other items (SignedHeaders) are not checked. AclError (without
    echoing the value) when it does not parse."""
    method, sep, rest = header.partition(" ")
    if not sep:
        raise AclError("authorization header is incorrect")
    access_key = signature = None
    for item in rest.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq:
            raise AclError("authorization keyValues length is incorrect")
        if key == "Credential":
            access_key = value.split("/")[0]
        elif key == "Signature":
            try:
                signature = bytes.fromhex(value)
            except ValueError:
                raise AclError("authorization signature is not hex") from None
    return access_key, signature


def sign_request(cmd, access_key: str, secret_key: str):
    """Add AccessKey and Signature to a request command (what AclClientRPCHook does); returns cmd."""
    ext = dict(cmd.ext_fields or {})
    ext[ACCESS_KEY] = access_key
    ext.pop(SIGNATURE, None)
    ext[SIGNATURE] = sign(secret_key, ext, cmd.body)
    cmd.ext_fields = ext
    return cmd


class AclValidator:
    """Checks requests against the accounts of a plain_acl.yml file."""

    def __init__(self, accounts, global_white_remote_addresses=()):
        #: the broker's maxHeartbeatElements: a heartbeat's body is decoded here within the same budget
        self.max_heartbeat_elements = DEFAULT_MAX_ELEMENTS
        self.accounts: dict[str, Account] = {}
        for a in accounts:
            self.accounts[a.access_key] = a
        self._global_white = [_AddressPattern(p) for p in global_white_remote_addresses]
        self._white = {a.access_key: _AddressPattern(a.white_remote_address) for a in accounts if a.white_remote_address}
        # ownedPermMap: None when the account names no resource (then only its defaults, or admin, decide)
        self._owned = {a.access_key: (dict(a.resource_perms) if a.resource_perms else None) for a in accounts}

    @classmethod
    def from_file(cls, path) -> "AclValidator":
        doc = parse_acl_yaml(Path(path).read_text(encoding="utf-8"))
        return cls.from_document(doc)

    @classmethod
    def from_document(cls, doc) -> "AclValidator":
        if not isinstance(doc, dict):
            raise AclError("acl file: the top level must be a mapping with an 'accounts' list")
        accounts = []
        raw = doc.get("accounts") or []
        if not isinstance(raw, list):
            raise AclError("acl file: 'accounts' must be a list")
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict):
                raise AclError(f"acl file: accounts[{i}] must be a mapping")
            ak, sk = entry.get("accessKey"), entry.get("secretKey")
            if not isinstance(ak, str) or not ak:
                raise AclError(f"acl file: accounts[{i}].accessKey is missing")
            if not isinstance(sk, str) or len(sk) < 6:
                # PlainAccessConfig check: the secret key must be at least 6 characters
                raise AclError(f"acl file: accounts[{i}].secretKey is missing or shorter than 6 characters")
            admin = entry.get("admin", False)
            admin = admin if isinstance(admin, bool) else str(admin).strip().lower() == "true"
            white = entry.get("whiteRemoteAddress") or ""
            perms = _resource_perms(entry, "groupPerms", i, False) + _resource_perms(entry, "topicPerms", i, True)
            accounts.append(Account(ak, sk, admin, str(white), parse_perm(entry.get("defaultTopicPerm")),
                                    parse_perm(entry.get("defaultGroupPerm")), perms))
        white = doc.get("globalWhiteRemoteAddresses") or []
        if not isinstance(white, list):
            raise AclError("acl file: 'globalWhiteRemoteAddresses' must be a list")
        return cls(accounts, [str(w) for w in white if w])

    def check(self, code: int, ext_fields: dict | None, body: bytes | None, remote_ip: str) -> str | None:
        """None when the request may proceed, else the NO_PERMISSION remark (PlainPermissionManager's words)."""
        if any(p.matches(remote_ip) for p in self._global_white):
            return None
        ext = ext_fields or {}
        access_key = ext.get(ACCESS_KEY)
        if not access_key:
            return "No accessKey is configured"
        account = self.accounts.get(access_key)
        if account is None:
            return f"No acl config for {echo(access_key)}"
        white = self._white.get(access_key)
        if white is not None and white.matches(remote_ip):
            return None
        signature = ext.get(SIGNATURE) or ""
        expected = sign(account.secret_key, ext, body)
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
            return f"Check signature failed for accessKey={echo(access_key)}"
        if code in ADMIN_CODES and not account.admin:
            return f"Need admin permission for request code={code}, but accessKey={echo(access_key)} is not"
        return self._check_resources(account, code, ext, body)

    def check_grpc(self, authorization: str | None, date_time: str | None, remote_ip: str,
                   resources: dict) -> tuple | None:
        """A 5.x client's call (its ``authorization`` and ``x-mq-date-time`` metadata) naming ``resources``
        (resource -> permission, groups as their retry topics): None when it may proceed, else ``(kind, remark)``
        with kind :data:`UNAUTHORIZED` (no, a malformed or a wrong signature, an unknown AccessKey) or
        :data:`FORBIDDEN` (a resource the account may not use). The checks of :meth:`check`, in its order."""
        if any(p.matches(remote_ip) for p in self._global_white):
            return None
        if not authorization:
            return UNAUTHORIZED, "No accessKey is configured"
        try:
            access_key, signature = parse_grpc_authorization(authorization)
        except AclError as e:
            return UNAUTHORIZED, str(e)
        if not access_key:
            return UNAUTHORIZED, "No accessKey is configured"
        account = self.accounts.get(access_key)
        if account is None:
            return UNAUTHORIZED, f"No acl config for {echo(access_key)}"
        white = self._white.get(access_key)
        if white is not None and white.matches(remote_ip):
            return None
        if not date_time:
            return UNAUTHORIZED, "datetime is null"
        expected = hmac.new(account.secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).digest()
        if signature is None or not hmac.compare_digest(expected, signature):
            return UNAUTHORIZED, f"Check signature failed for accessKey={echo(access_key)}"
        remark = self._check_needed(account, resources)
        return None if remark is None else (FORBIDDEN, remark)

    def _check_resources(self, account: Account, code: int, ext: dict, body) -> str | None:
        """PlainPermissionManager.checkPerm after the admin check: each named resource against the account."""
        owned = self._owned[account.access_key]
        if owned is None:
            if account.admin:
                return None  # an admin without per-resource permissions may use every resource
            if (code == RequestCode.HEART_BEAT and check_permission(SUB, account.default_topic_perm)
                    and check_permission(SUB, account.default_group_perm)):
                return None  # a heartbeat needs SUB only and the defaults grant it: no need to decode the body
        try:
            needed = request_resources(code, ext, body, self.max_heartbeat_elements)
        except RemotingError as e:
            return f"Cannot read the resources of request code={code}: {e}"
        return self._check_needed(account, needed)

    def _check_needed(self, account: Account, needed: dict) -> str | None:
        """Each resource -> permission of ``needed`` against the account (its own entry, else its default)."""
        owned = self._owned[account.access_key]
        if owned is None and account.admin:
            return None
        for resource, perm in needed.items():
            own = owned.get(resource) if owned is not None else None
            if own is None:
                own = account.default_group_perm if resource.startswith(RETRY_GROUP_TOPIC_PREFIX) \
                    else account.default_topic_perm
            if not check_permission(perm, own):
                return f"No default permission for {_resource_name(resource)}"
        return None

    def __repr__(self) -> str:
        return f"AclValidator(accounts={sorted(self.accounts)})"


def _resource_perms(entry: dict, key: str, i: int, is_topic: bool) -> tuple:
    """Permission.parseResourcePerms: ``name=PERM`` items; a group becomes its retry topic."""
    items = entry.get(key)
    if items is None:
        return ()
    if not isinstance(items, list):
        raise AclError(f"acl file: accounts[{i}].{key} must be a list of 'name=PERM'")
    out = []
    for n, item in enumerate(items):
        parts = [p for p in str(item).split("=") if p]  # StringUtils.split: empty tokens dropped
        if len(parts) != 2 or not parts[0].strip():
            raise AclError(f"acl file: accounts[{i}].{key}[{n}]: expected 'name=PERM', got {echo(str(item))}")
        name = parts[0].strip()
        out.append((name if is_topic else retry_topic(name), parse_perm(parts[1])))
    return tuple(out)


class _AddressPattern:
    """RocketMQ remote-address patterns: '*', an exact IP, IPv4 with '*' or 'a-b' segments (10.1.*.1-9), or a list
    of last parts in braces (192.168.0.{100,101}: MultipleRemoteAddressStrategy)."""

    def __init__(self, pattern: str):
        self.pattern = pattern.strip()
        self._parts = None
        self._any_of = None
        head, brace, rest = self.pattern.partition("{")
        if brace and rest.endswith("}"):
            self._any_of = {head + item.strip() for item in rest[:-1].split(",") if item.strip()}
        elif self.pattern not in ("*", "*.*.*.*") and "." in self.pattern:
            self._parts = self.pattern.split(".")

    def matches(self, ip: str) -> bool:
        if self.pattern in ("*", "*.*.*.*"):
            return True
        if self._any_of is not None:
            return ip in self._any_of
        if self._parts is None or len(self._parts) != 4:
            return ip == self.pattern
        segs = ip.split(".")
        if len(segs) != 4:
            return False
        for p, s in zip(self._parts, segs):
            if p == "*":
                continue
            if "-" in p:
                lo, _, hi = p.partition("-")
                if not (s.isdigit() and lo.isdigit() and hi.isdigit() and int(lo) <= int(s) <= int(hi)):
                    return False
            elif p != s:
                return False
        return True


# ---------------------------------------------------------------------------------------------------------------
# The YAML subset plain_acl.yml uses: block mappings and sequences, plain or quoted scalars, comments.

_KEY_RE = re.compile(r"^([A-Za-z_][\w.-]*)\s*:(?:\s+(.*))?$")


def parse_acl_yaml(text: str):
    """Parse the YAML subset of plain_acl.yml into dicts, lists and scalars (errors name the line)."""
    lines = []
    for no, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise AclError(f"acl file line {no}: tabs are not allowed for indentation")
        body = _strip_comment(raw).rstrip()
        if body.strip() and body.strip() != "---":
            lines.append((no, len(body) - len(body.lstrip(" ")), body.strip()))
    if not lines:
        return {}
    value, i = _parse_block(lines, 0, lines[0][1])
    if i != len(lines):
        raise AclError(f"acl file line {lines[i][0]}: unexpected indentation")
    return value


def _strip_comment(line: str) -> str:
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _parse_block(lines, i, indent):
    no, ind, text = lines[i]
    if text.startswith("- ") or text == "-":
        return _parse_seq(lines, i, indent)
    return _parse_map(lines, i, indent)


def _parse_seq(lines, i, indent):
    out = []
    while i < len(lines):
        no, ind, text = lines[i]
        if ind < indent:
            break
        if ind > indent:
            raise AclError(f"acl file line {no}: unexpected indentation")
        if not (text.startswith("- ") or text == "-"):
            break
        item = text[1:].strip()
        if not item:
            if i + 1 < len(lines) and lines[i + 1][1] > indent:
                value, i = _parse_block(lines, i + 1, lines[i + 1][1])
            else:
                value, i = None, i + 1
            out.append(value)
            continue
        if _KEY_RE.match(item) and not item.startswith(("'", '"')):
            # "- key: value" opens a mapping whose further keys are indented like "key"
            inner = indent + (len(text) - len(item))
            sub = [(no, inner, item)]
            j = i + 1
            while j < len(lines) and lines[j][1] >= inner:
                sub.append(lines[j])
                j += 1
            value, k = _parse_map(sub, 0, inner)
            if k != len(sub):
                raise AclError(f"acl file line {sub[k][0]}: unexpected indentation")
            out.append(value)
            i = j
            continue
        out.append(_scalar(item, no))
        i += 1
    return out, i


def _parse_map(lines, i, indent):
    out = {}
    while i < len(lines):
        no, ind, text = lines[i]
        if ind < indent:
            break
        if ind > indent:
            raise AclError(f"acl file line {no}: unexpected indentation")
        m = _KEY_RE.match(text)
        if not m:
            if text.startswith("-"):
                break
            # no echo of the line: a malformed line may be a secretKey line (the line number is enough)
            raise AclError(f"acl file line {no}: expected 'key: value'")
        key, rest = m.group(1), (m.group(2) or "").strip()
        if key in out:
            raise AclError(f"acl file line {no}: duplicate key {key!r}")
        if rest:
            out[key] = _scalar(rest, no)
            i += 1
        elif i + 1 < len(lines) and (lines[i + 1][1] > indent or (lines[i + 1][1] == indent and lines[i + 1][2].startswith("-"))):
            out[key], i = _parse_block(lines, i + 1, lines[i + 1][1])
        else:
            out[key] = None
            i += 1
    return out, i


def _scalar(text: str, no: int):
    if text[0] in "'\"":
        q = text[0]
        if len(text) < 2 or text[-1] != q:
            raise AclError(f"acl file line {no}: unterminated quoted string")
        inner = text[1:-1]
        if q == "'":
            return inner.replace("''", "'")
        if "\\" not in inner:
            return inner
        try:
            return inner.encode("utf-8").decode("unicode_escape")
        except UnicodeDecodeError:  # a bad escape; the codec's message would quote the value (maybe a secret)
            raise AclError(f"acl file line {no}: bad escape in a quoted string") from None
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(p.strip(), no) for p in text[1:-1].split(",") if p.strip()]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~"):
        return None
    return text
