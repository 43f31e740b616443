"""Admin queries over the wire, like mqadmin's consumerConnection and producerConnection.

``AdminClient(host, port)`` speaks the remoting protocol to a broker (GET_CONSUMER_CONNECTION_LIST 203,
GET_PRODUCER_CONNECTION_LIST 204, or any request with :meth:`AdminClient.invoke`); with ``access_key`` and
``secret_key`` it signs requests as AclClientRPCHook does. The CLI mains print mqadmin's columns
(ConsumerConnectionSubCommand / ProducerConnectionSubCommand) or, with ``--json``, the decoded body.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from engine.codec.enums import RequestCode, ResponseCode
from engine.codec.errors import RemotingError, echo


class AdminError(RemotingError, ValueError):
    """The broker answered an admin request with an error code, or the exchange failed."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


def _version_names() -> tuple:
    """MQVersion.Version names by ordinal (V3_0_0_SNAPSHOT = 0 ... V5_3_3 = 479 ... HIGHER_VERSION = 612)."""
    names = ["V3_0_0_SNAPSHOT", "V3_0_0_ALPHA1"] + [f"V3_0_0_BETA{i}" for i in range(1, 6)]
    for i in range(6, 10):
        names += [f"V3_0_0_BETA{i}_SNAPSHOT", f"V3_0_0_BETA{i}"]
    names.append("V3_0_0_FINAL")
    patches = {(3, 0): range(1, 16), (3, 1): range(0, 10), (3, 2): range(0, 10)}
    for major in (3, 4, 5):
        for minor in range(10):
            for patch in patches.get((major, minor), range(1, 10) if major == 3 else range(10)):
                names += [f"V{major}_{minor}_{patch}_SNAPSHOT", f"V{major}_{minor}_{patch}"]
    names.append("HIGHER_VERSION")
    return tuple(names)


VERSION_NAMES = _version_names()


def version_desc(value: int) -> str:
    """MQVersion.getVersionDesc: the name of an ordinal, clamped to the last one (a negative shows as a number)."""
    if value < 0:
        return str(value)
    return VERSION_NAMES[min(value, len(VERSION_NAMES) - 1)]


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AdminError(f"broker address must be HOST:PORT, not {echo(addr)}")
    return host.strip("[]"), int(port)


class AdminClient:
    """A blocking remoting client for one broker or name server address."""

    def __init__(self, host: str, port: int, timeout: float = 5.0, access_key: str | None = None,
                 secret_key: str | None = None):
        from engine import FrameDecoder

        self.host, self.port, self.timeout = host, port, timeout
        self.access_key, self.secret_key = access_key, secret_key
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._decoder = FrameDecoder()
        self._pending: list = []
        self._opaque = int(time.time()) & 0xFFFF

    def close(self) -> None:
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def invoke(self, code: int, ext_fields: dict | None = None, body: bytes = b""):
        """Send one request and return its response command."""
        from engine import RemotingCommand

        self._opaque = (self._opaque + 1) & 0x7FFFFFFF
        cmd = RemotingCommand(int(code), opaque=self._opaque, ext_fields=dict(ext_fields or {}), body=body)
        if self.access_key and self.secret_key:
            from engine.broker.acl import sign_request

            sign_request(cmd, self.access_key, self.secret_key)
        self._sock.sendall(cmd.encode())
        deadline = time.monotonic() + self.timeout
        while True:
            for c in self._pending:
                if c.is_response and c.opaque == cmd.opaque:
                    self._pending.remove(c)
                    return c
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AdminError(f"no response from {self.host}:{self.port} in {self.timeout:g} s")
            self._sock.settimeout(remaining)
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                raise AdminError(f"{self.host}:{self.port} closed the connection")
            # requests from the broker (none expected) and stale responses are dropped
            self._pending.extend(c for c in self._decoder.feed(data) if c.is_response)

    def _body_or_raise(self, resp) -> dict:
        if resp.code != ResponseCode.SUCCESS:
            raise AdminError(f"CODE: {resp.code}  DESC: {resp.remark}", resp.code)
        try:
            return json.loads(resp.body or b"{}")
        except ValueError as e:
            raise AdminError(f"undecodable response body: {e}") from None

    def consumer_connection(self, group: str) -> dict:
        """ConsumerConnection of a group (GET_CONSUMER_CONNECTION_LIST)."""
        resp = self.invoke(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        return self._body_or_raise(resp)

    def producer_connection(self, group: str) -> dict:
        """ProducerConnection of a group (GET_PRODUCER_CONNECTION_LIST)."""
        resp = self.invoke(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group})
        return self._body_or_raise(resp)

    def update_topic(self, topic: str, read_queue_nums: int = 8, write_queue_nums: int = 8, perm: int = 6) -> None:
        """Create or update a topic on this broker (UPDATE_AND_CREATE_TOPIC, as mqadmin updateTopic sends it)."""
        resp = self.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(read_queue_nums),
            "writeQueueNums": str(write_queue_nums), "perm": str(perm), "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0", "order": "false"})
        if resp.code != ResponseCode.SUCCESS:
            from engine.logutil import escape_text

            raise AdminError(f"CODE: {resp.code}  DESC: {escape_text((resp.remark or '')[:512])}", resp.code)

    def route(self, topic: str) -> dict:
        resp = self.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        return self._body_or_raise(resp)


# ---------------------------------------------------------------------------------------------------------------
# printing (mqadmin's formats)


def format_consumer_connection(cc: dict) -> str:
    lines = ["%-36s %-22s %-10s %s" % ("#ClientId", "#ClientAddr", "#Language", "#Version")]
    for c in cc.get("connectionSet") or []:
        lines.append("%-36s %-22s %-10s %s" % (c.get("clientId"), c.get("clientAddr"), c.get("language"),
                                               version_desc(int(c.get("version") or 0))))
    lines.append("")
    lines.append("Below is subscription:")
    lines.append("%-20s %s" % ("#Topic", "#SubExpression"))
    for topic, sd in (cc.get("subscriptionTable") or {}).items():
        lines.append("%-20s %s" % (sd.get("topic", topic), sd.get("subString")))
    lines.append("")
    lines.append(f"ConsumeType: {cc.get('consumeType')}")
    lines.append(f"MessageModel: {cc.get('messageModel')}")
    lines.append(f"ConsumeFromWhere: {cc.get('consumeFromWhere')}")
    return "\n".join(lines) + "\n"


def format_producer_connection(pc: dict) -> str:
    lines = []
    for i, c in enumerate(pc.get("connectionSet") or [], 1):
        lines.append("%04d  %-32s %-22s %-8s %s" % (i, c.get("clientId"), c.get("clientAddr"), c.get("language"),
                                                  version_desc(int(c.get("version") or 0))))
    return "\n".join(lines) + ("\n" if lines else "")


def _common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-b", "--brokerAddr", help="broker address HOST:PORT")
    p.add_argument("-n", "--namesrvAddr", help="name server address HOST:PORT (route lookup when no -b)")
    p.add_argument("--json", action="store_true", help="print the response body as JSON")
    p.add_argument("--access-key", help="ACL access key; its secret key comes from $RMQHB_SECRET_KEY or "
                                        "--secret-key-file, never from the command line")
    p.add_argument("--secret-key-file", metavar="PATH",
                   help="file holding the ACL secret key (its first line); else $RMQHB_SECRET_KEY")
    # a secret in argv is visible in ps and kept in shell history: the option is refused with the alternatives
    p.add_argument("--secret-key", dest="secret_key_argv", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer (default 5)")


SECRET_KEY_ENV = "RMQHB_SECRET_KEY"


def _secret_key(args) -> str | None:
    """The ACL secret key: from --secret-key-file, else $RMQHB_SECRET_KEY; never from argv."""
    if args.secret_key_argv is not None:
        raise AdminError(f"--secret-key is not accepted: a secret on the command line shows in ps and in shell "
                         f"history; put it in a file (--secret-key-file PATH) or in ${SECRET_KEY_ENV}")
    if args.secret_key_file:
        try:
            with open(args.secret_key_file, encoding="utf-8") as f:
                secret = f.readline().strip()
        except OSError as e:
            raise AdminError(f"cannot read --secret-key-file: {e.strerror}") from None
        if not secret:
            raise AdminError("--secret-key-file is empty")
        return secret
    secret = os.environ.get(SECRET_KEY_ENV)
    if args.access_key and not secret:
        raise AdminError(f"--access-key needs its secret key in --secret-key-file PATH or ${SECRET_KEY_ENV}")
    return secret or None


def _client(args, host: str, port: int) -> "AdminClient":
    return AdminClient(host, port, args.timeout, args.access_key, args.secret_key)


def _brokers(args, topic: str | None) -> list[tuple[str, int]]:
    if args.brokerAddr:
        return [split_addr(args.brokerAddr)]
    if not args.namesrvAddr:
        raise AdminError("give the broker (-b HOST:PORT) or a name server (-n HOST:PORT)")
    if not topic:
        raise AdminError("a name-server lookup needs a topic (-t)")
    host, port = split_addr(args.namesrvAddr.split(";")[0])
    with _client(args, host, port) as c:
        route = c.route(topic)
    out = []
    for bd in route.get("brokerDatas") or []:
        addr = (bd.get("brokerAddrs") or {}).get("0")
        if addr:
            out.append(split_addr(addr))
    if not out:
        raise AdminError(f"no master broker in the route of {topic}")
    return out


def consumer_connection_main(argv=None) -> int:
    """rmqhb consumerConnection -g GROUP -b HOST:PORT [--json]: connections, subscriptions and consume settings."""
    p = argparse.ArgumentParser(prog="rmqhb consumerConnection",
                                description="Query consumer's socket connection, client version and subscription.")
    p.add_argument("-g", "--consumerGroup", required=True, help="consumer group name")
    p.add_argument("-t", "--topic", help="topic (for a name-server lookup with -n)")
    _common_args(p)
    args = p.parse_args(argv)
    try:
        args.secret_key = _secret_key(args)
        brokers = _brokers(args, args.topic)
        results = []
        for host, port in brokers:
            with _client(args, host, port) as c:
                results.append(c.consumer_connection(args.consumerGroup.strip()))
    except (AdminError, OSError) as e:
        print(f"ConsumerConnectionSubCommand command failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2, ensure_ascii=False))
    else:
        for cc in results:
            sys.stdout.write(format_consumer_connection(cc))
    return 0


def producer_connection_main(argv=None) -> int:
    """rmqhb producerConnection -g GROUP -t TOPIC -b HOST:PORT [--json]: the group's producer connections."""
    p = argparse.ArgumentParser(prog="rmqhb producerConnection",
                                description="Query producer's socket connection and client version.")
    p.add_argument("-g", "--producerGroup", required=True, help="producer group name")
    p.add_argument("-t", "--topic", required=True, help="topic name")
    _common_args(p)
    args = p.parse_args(argv)
    try:
        args.secret_key = _secret_key(args)
        brokers = _brokers(args, args.topic.strip())
        merged = {"connectionSet": []}
        for host, port in brokers:
            with _client(args, host, port) as c:
                merged["connectionSet"].extend(c.producer_connection(args.producerGroup.strip()).get("connectionSet") or [])
    except (AdminError, OSError) as e:
        print(f"ProducerConnectionSubCommand command failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(merged, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(format_producer_connection(merged))
    return 0


def update_topic_main(argv=None) -> int:
    """rmqhb updateTopic -b HOST:PORT -t TOPIC [-r N] [-w N] [-p PERM]: create or update a topic on one broker."""
    p = argparse.ArgumentParser(prog="rmqhb updateTopic", description="Update or create topic (on one broker).")
    p.add_argument("-t", "--topic", required=True, help="topic name")
    p.add_argument("-r", "--readQueueNums", type=int, default=8, help="set read queue nums (default 8)")
    p.add_argument("-w", "--writeQueueNums", type=int, default=8, help="set write queue nums (default 8)")
    p.add_argument("-p", "--perm", type=int, default=6, help="set topic's permission (2|4|6; default 6)")
    _common_args(p)
    args = p.parse_args(argv)
    if not args.brokerAddr:
        p.error("the broker (-b HOST:PORT) is required")
    try:
        args.secret_key = _secret_key(args)
        host, port = split_addr(args.brokerAddr)
        topic = args.topic.strip()
        with _client(args, host, port) as c:
            c.update_topic(topic, args.readQueueNums, args.writeQueueNums, args.perm)
    except (AdminError, OSError) as e:
        print(f"UpdateTopicSubCommand command failed: {e}", file=sys.stderr)
        return 1
    from engine.logutil import escape_text

    print(f"create topic to {escape_text(args.brokerAddr.strip())} success: topic={escape_text(topic)} "
          f"readQueueNums={args.readQueueNums} writeQueueNums={args.writeQueueNums} perm={args.perm}")
    return 0
