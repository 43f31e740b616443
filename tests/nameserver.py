"""A RocketMQ 4.9.8 name server's route table, for tests that run the broker as a deployment does.

It keeps what 4.9.8's ``RouteInfoManager`` keeps from REGISTER_BROKER (the cluster, broker-address and topic-queue
tables, filled from the body's ``topicConfigTable`` when the body's dataVersion changed or the broker registers
first) and answers GET_ROUTEINFO_BY_TOPIC as ``DefaultRequestProcessor.getRouteInfoByTopic`` does: the topic's
queue datas and their brokers, or TOPIC_NOT_EXIST with Java's remark for a topic no broker registered. A broker's
routes go with UNREGISTER_BROKER, with its connection (``onChannelDestroy``) and when it has not registered for
``broker_expired_s`` (``scanNotActiveBroker``, 120 s). GET_BROKER_CLUSTER_INFO answers the cluster tables. Route
bodies are encoded as 4.9.8 encodes them: standard JSON for a request of version >= V4_9_4 (401), else fastjson's
default with bare numeric ``brokerAddrs`` keys (PROTOCOL.md 8.3). Every other request is answered
REQUEST_CODE_NOT_SUPPORTED and counted in ``unsupported``. The frames are the project's codec (engine.FrameDecoder,
RemotingCommand). It runs on a thread of its own::

    with NameServer() as ns:
        cfg = BrokerConfig(namesrv_addr=ns.addr, ...)
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import zlib

from engine import FrameDecoder
from engine.codec.enums import RequestCode, ResponseCode

#: MQVersion.Version.V4_9_4.ordinal(): from this request version on, route bodies are standard JSON
V4_9_4 = 401
#: FAQUrl.suggestTodo(FAQUrl.APPLY_TOPIC_URL), appended to the TOPIC_NOT_EXIST remark
APPLY_TOPIC_SUGGESTION = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
MASTER_ID = 0


class NameServer:
    """REGISTER_BROKER / UNREGISTER_BROKER / GET_ROUTEINFO_BY_TOPIC / GET_BROKER_CLUSTER_INFO on 127.0.0.1."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, broker_expired_s: float = 120.0):
        self.host, self._want_port, self.broker_expired_s = host, port, broker_expired_s
        self.port = 0
        self.cluster_addr_table: dict[str, set] = {}
        self.broker_addr_table: dict[str, dict] = {}  # brokerName -> {"cluster", "brokerName", "brokerAddrs"}
        self.topic_queue_table: dict[str, dict] = {}  # topic -> brokerName -> QueueData
        self.broker_live_table: dict[str, dict] = {}  # brokerAddr -> {"last", "dataVersion", "writer"}
        #: every request received, as (code, ext fields), and the codes answered REQUEST_CODE_NOT_SUPPORTED
        self.requests: list[tuple[int, dict]] = []
        self.unsupported: list[int] = []
        #: topics asked for, and those answered TOPIC_NOT_EXIST
        self.route_queries: list[str] = []
        self.not_found: list[str] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "NameServer":
        ready = threading.Event()
        errors = []

        def run():
            loop = self._loop = asyncio.new_event_loop()
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, self.host, self._want_port))
                self.port = self._server.sockets[0].getsockname()[1]
                scan = loop.create_task(self._scan_not_active_broker())
            except BaseException as e:  # noqa: BLE001 - reported to start()
                errors.append(e)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                scan.cancel()
                self._server.close()
                # every connection's task ends here, on this loop: one left pending is finalized later by the
                # garbage collector, on whatever thread, with a closed loop ("Task was destroyed but it is
                # pending!", a traceback formatted inside another test's ast.parse: Python 3.11's SystemError
                # "AST constructor recursion depth mismatch" in the twin CI run's test_wire_fuzz)
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in pending:
                    t.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name="test-nameserver", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("name server did not start")
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> "NameServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading the table (tests)
    def route(self, topic: str) -> dict | None:
        """pickupTopicRouteData: the TopicRouteData of ``topic``, or None (no queue data or no broker data)."""
        with self._lock:
            return self._pickup_topic_route_data(topic)

    def topics_of(self, broker_name: str) -> dict:
        """topic -> QueueData this name server holds for ``broker_name``."""
        with self._lock:
            return {t: dict(q[broker_name]) for t, q in self.topic_queue_table.items() if broker_name in q}

    def count(self, code: int) -> int:
        with self._lock:
            return sum(1 for c, _ in self.requests if c == code)

    # ------------------------------------------------------------------ connections
    async def _serve(self, reader, writer) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for cmd in decoder.feed(data):
                    if cmd.is_response:
                        continue
                    resp = self._process(cmd, writer)
                    if resp is not None and not cmd.is_oneway:
                        writer.write(resp.encode())
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        except Exception:  # a frame the codec refuses: Netty closes the channel
            pass
        except asyncio.CancelledError:
            # the name server stops: end as a finished task, since the stream server's done callback calls
            # task.exception(), which raises for a cancelled one (logged as "Exception in callback ...")
            pass
        finally:
            self._on_channel_destroy(writer)
            writer.close()

    def _process(self, cmd, writer):
        ext = dict(cmd.ext_fields or {})
        with self._lock:
            self.requests.append((cmd.code, ext))
            if cmd.code == RequestCode.REGISTER_BROKER:
                return self._register_broker(cmd, ext, writer)
            if cmd.code == RequestCode.UNREGISTER_BROKER:
                self._unregister_broker(ext.get("clusterName", ""), ext.get("brokerAddr", ""),
                                        ext.get("brokerName", ""), int(ext.get("brokerId", "0")))
                return cmd.response(ResponseCode.SUCCESS)
            if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                return self._get_route_info_by_topic(cmd, ext)
            if cmd.code == RequestCode.GET_BROKER_CLUSTER_INFO:
                datas = self._broker_datas_json(self.broker_addr_table.values(), cmd)
                info = {"brokerAddrTable": {d["brokerName"]: d for d in datas},
                        "clusterAddrTable": {c: sorted(n) for c, n in self.cluster_addr_table.items()}}
                return cmd.response(ResponseCode.SUCCESS, body=_dumps(info).encode("utf-8"))
            self.unsupported.append(cmd.code)
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                remark=f" request type {cmd.code} not supported")

    # ------------------------------------------------------------------ RouteInfoManager
    def _register_broker(self, cmd, ext, writer):
        crc = int(ext.get("bodyCrc32", "0") or 0)
        body = cmd.body or b""
        if crc != 0 and crc != zlib.crc32(body) & 0x7FFFFFFF:  # UtilAll.crc32
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="crc32 not match")
        if ext.get("compressed") == "true":
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="compressed bodies are not read by this name server")
        wrapper = json.loads(body)["topicConfigSerializeWrapper"] if body else {"dataVersion": {}}
        cluster, addr, name = ext["clusterName"], ext["brokerAddr"], ext["brokerName"]
        broker_id = int(ext["brokerId"])
        self.cluster_addr_table.setdefault(cluster, set()).add(name)
        register_first = False
        data = self.broker_addr_table.get(name)
        if data is None:
            register_first = True
            data = self.broker_addr_table[name] = {"cluster": cluster, "brokerName": name, "brokerAddrs": {}}
        addrs = data["brokerAddrs"]
        for bid in [b for b, a in addrs.items() if a == addr and b != broker_id]:
            del addrs[bid]
        old_addr = addrs.get(broker_id)
        addrs[broker_id] = addr
        register_first = register_first or old_addr is None
        version = wrapper.get("dataVersion") or {}
        if broker_id == MASTER_ID:
            live = self.broker_live_table.get(addr)
            if register_first or live is None or live["dataVersion"] != version:
                for tc in (wrapper.get("topicConfigTable") or {}).values():
                    self.topic_queue_table.setdefault(tc["topicName"], {})[name] = {
                        "brokerName": name, "perm": tc.get("perm", 6), "readQueueNums": tc.get("readQueueNums", 16),
                        "topicSysFlag": tc.get("topicSysFlag", 0), "writeQueueNums": tc.get("writeQueueNums", 16)}
        self.broker_live_table[addr] = {"last": time.monotonic(), "dataVersion": version, "writer": writer,
                                        "cluster": cluster, "brokerName": name, "brokerId": broker_id}
        return cmd.response(ResponseCode.SUCCESS)  # haServerAddr / masterAddr: null for a master (not sent)

    def _unregister_broker(self, cluster: str, addr: str, name: str, broker_id: int) -> None:
        self.broker_live_table.pop(addr, None)
        data = self.broker_addr_table.get(name)
        remove_name = False
        if data is not None:
            data["brokerAddrs"].pop(broker_id, None)
            if not data["brokerAddrs"]:
                del self.broker_addr_table[name]
                remove_name = True
        if remove_name:
            names = self.cluster_addr_table.get(cluster)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.cluster_addr_table[cluster]
            for topic in list(self.topic_queue_table):  # removeTopicByBrokerName
                queues = self.topic_queue_table[topic]
                queues.pop(name, None)
                if not queues:
                    del self.topic_queue_table[topic]

    def _on_channel_destroy(self, writer) -> None:
        with self._lock:
            for addr, live in list(self.broker_live_table.items()):
                if live["writer"] is writer:
                    self._unregister_broker(live["cluster"], addr, live["brokerName"], live["brokerId"])

    async def _scan_not_active_broker(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.broker_expired_s))
            now = time.monotonic()
            with self._lock:
                for addr, live in list(self.broker_live_table.items()):
                    if now - live["last"] > self.broker_expired_s:
                        live["writer"].close()
                        self._unregister_broker(live["cluster"], addr, live["brokerName"], live["brokerId"])

    def _pickup_topic_route_data(self, topic):
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        brokers = [self.broker_addr_table[n] for n in queues if n in self.broker_addr_table]
        if not brokers:
            return None
        return {"brokerDatas": brokers, "filterServerTable": {}, "queueDatas": list(queues.values())}

    def _get_route_info_by_topic(self, cmd, ext):
        topic = ext.get("topic")
        self.route_queries.append(topic)
        route = self._pickup_topic_route_data(topic)
        if route is None:
            self.not_found.append(topic)
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, remark=(
                f"No topic route info in name server for the topic: {topic}{APPLY_TOPIC_SUGGESTION}"))
        route = dict(route, brokerDatas=self._broker_datas_json(route["brokerDatas"], cmd))
        return cmd.response(ResponseCode.SUCCESS, body=_dumps(route).encode("utf-8"))

    # ------------------------------------------------------------------ encoding (fastjson as 4.9.8 uses it)
    @staticmethod
    def _broker_datas_json(datas, cmd):
        standard = cmd.version >= V4_9_4 or (cmd.ext_fields or {}).get("acceptStandardJsonOnly") == "true"
        out = []
        for d in datas:
            addrs = {str(k): v for k, v in sorted(d["brokerAddrs"].items())}
            out.append({"brokerAddrs": addrs if standard else _BareKeys(addrs), "brokerName": d["brokerName"],
                        "cluster": d["cluster"]})
        return out



class _BareKeys(dict):
    """A Map<Long, String> fastjson writes with bare numeric keys (its default, below V4_9_4)."""


def _dumps(obj) -> str:
    if isinstance(obj, _BareKeys):
        return "{" + ",".join(f"{k}:{json.dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_dumps(v)}" for k, v in sorted(obj.items())) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_dumps(v) for v in obj) + "]"
    return json.dumps(obj, ensure_ascii=False)
