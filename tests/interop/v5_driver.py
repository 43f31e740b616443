"""Drives the official RocketMQ 5.x Python client (PyPI rocketmq-python-client 5.1.2, gRPC) against our broker.

Run with the interpreter of its own venv (tests/interop/.v5: the 5.x client's top-level package ``rocketmq`` is
not the 4.x C++ client's ``rocketmq`` the other interop tests use) and HOME pointed at a scratch folder (the client
logs under $HOME/logs/rocketmq_python). argv[1]: JSON {endpoint, producerTopics?, pushConsumers?: [{group, topic,
expr}], simpleConsumers?: [{group, topic, expr} or {group, subscriptions: {topic: expr}}], receive?: bool,
accessKey?, secretKey? (the credentials the clients sign their calls with: the 5.x ACL scheme), heartbeatSeconds?
(the period of the clients' Heartbeat: 10 s in the client, shorter for a test that watches several), tls? (the
clients' tls_enable: TLS with grpc's default roots, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)}. stdout:
"READY <clientId> ..." once every client has started (one id per client, in the order producer, push consumers,
simple consumers), "RECEIVED <n>" per simple consumer with ``receive`` (one receive call), then "CLOSED" after
"close" on stdin.
"""
import json
import sys


def main() -> int:
    spec = json.loads(sys.argv[1])
    from rocketmq.v5.client import ClientConfiguration, Credentials
    from rocketmq.v5.consumer import ConsumeResult, MessageListener, PushConsumer, SimpleConsumer
    from rocketmq.v5.model import FilterExpression
    from rocketmq.v5.producer import Producer

    if spec.get("heartbeatSeconds"):
        # the client starts its heartbeat thread as ClientScheduler(<id>_heartbeat_schedule_thread, fn, 1, 10)
        import rocketmq.v5.client.client as client_module

        scheduler = client_module.ClientScheduler

        def shorter(name, target, initial_delay, delay, loop=None):
            if name.endswith("_heartbeat_schedule_thread"):
                delay = spec["heartbeatSeconds"]
            return scheduler(name, target, initial_delay, delay, loop)

        client_module.ClientScheduler = shorter

    class Listener(MessageListener):
        def consume(self, message):
            return ConsumeResult.SUCCESS

    tls = bool(spec.get("tls"))

    def config():
        return ClientConfiguration(spec["endpoint"], Credentials(spec.get("accessKey", ""), spec.get("secretKey", "")))

    clients = []
    try:
        if spec.get("producerTopics"):
            producer = Producer(config(), tuple(spec["producerTopics"]), tls_enable=tls)
            producer.startup()
            clients.append(producer)
        for c in spec.get("pushConsumers") or []:
            consumer = PushConsumer(config(), c["group"], Listener(), {c["topic"]: FilterExpression(c.get("expr") or "*")},
                                    tls_enable=tls)
            consumer.startup()
            clients.append(consumer)
        simple = []
        for c in spec.get("simpleConsumers") or []:
            subs = c.get("subscriptions") or {c["topic"]: c.get("expr")}
            consumer = SimpleConsumer(config(), c["group"],
                                      {t: FilterExpression(e or "*") for t, e in subs.items()}, await_duration=5,
                                      tls_enable=tls)
            consumer.startup()
            clients.append(consumer)
            simple.append(consumer)
    except Exception as e:
        print(f"FAILED {type(e).__name__}: {e}", flush=True)
        return 1
    print("READY " + " ".join(c.client_id for c in clients), flush=True)
    if spec.get("receive"):
        for consumer in simple:
            print(f"RECEIVED {len(consumer.receive(16, 15) or [])}", flush=True)
    for line in sys.stdin:
        if line.strip() == "close":
            break
    for c in clients:
        c.shutdown()
    print("CLOSED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
