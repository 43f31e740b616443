"""Drives the Apache rocketmq-client-cpp library (PyPI rocketmq 0.4.4, ctypes) against our broker.

Run in its own interpreter with the package on PYTHONPATH and HOME pointed at a scratch folder (the library
writes its logs under $HOME/logs/rocketmq-cpp). argv[1]: JSON {nameSrv, producerGroup?, consumers: [{group,
topic, expr, broadcast}], send?: [topic], accessKey?, secretKey?}. stdout: "SENT <topic> <outcome>" for each topic of
`send` (the producer sends one message to each before the consumers start), "READY" once started, "CLOSED" after
"close" on stdin.
"""
import json
import sys


def main() -> int:
    spec = json.loads(sys.argv[1])
    from rocketmq.client import Message, MessageModel, Producer, PushConsumer

    roles = []
    if spec.get("producerGroup"):
        producer = Producer(spec["producerGroup"])
        producer.set_namesrv_addr(spec["nameSrv"])
        if spec.get("accessKey"):
            producer.set_session_credentials(spec["accessKey"], spec["secretKey"], "ALIYUN")
        producer.start()
        roles.append(producer)
        for topic in spec.get("send") or []:
            msg = Message(topic)
            msg.set_tags("TagA")
            msg.set_body("interop")
            try:
                outcome = producer.send_sync(msg).status
            except Exception as e:  # the broker stores no message: the send fails after its topic is created
                outcome = f"error {type(e).__name__} {e}"
            print("SENT", topic, " ".join(str(outcome).split()), flush=True)
    for c in spec.get("consumers") or []:
        model = MessageModel.BROADCASTING if c.get("broadcast") else MessageModel.CLUSTERING
        consumer = PushConsumer(c["group"], message_model=model)
        consumer.set_namesrv_addr(spec["nameSrv"])
        if spec.get("accessKey"):
            consumer.set_session_credentials(spec["accessKey"], spec["secretKey"], "ALIYUN")
        consumer.subscribe(c["topic"], lambda msg: None, c.get("expr") or "*")
        consumer.start()
        roles.append(consumer)
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "close":
            break
    for r in reversed(roles):
        r.shutdown()
    print("CLOSED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
