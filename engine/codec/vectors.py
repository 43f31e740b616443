"""The real-client frame captures in ../shared/vectors (see its README): used by the demo, tests and benches."""
import json
import os
from pathlib import Path


#: PROTOCOL.md 4.4's HEART_BEAT body of a Java 5.x push consumer (686 bytes, fastjson: sorted keys), verbatim
#: (tests/test_heartbeat.py checks it against the spec): the one spelled-out sample tests and benches share.
JAVA_HEARTBEAT_BODY = (
    b'{"clientID":"192.168.1.10@12345#1234567890123","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
    b'"consumeType":"CONSUME_PASSIVELY","groupName":"demo_consumer_group","messageModel":"CLUSTERING",'
    b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*",'
    b'"subVersion":1718000000001,"tagsSet":[],"topic":"%RETRY%demo_consumer_group"},{"classFilterMode":false,'
    b'"codeSet":[2598919,2598920],"expressionType":"TAG","subString":"TagA || TagB","subVersion":1718000000000,'
    b'"tagsSet":["TagA","TagB"],"topic":"TopicTest"}],"unitMode":false}],"heartbeatFingerprint":0,'
    b'"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}],"withoutSub":false}'
)


def shared_dir() -> Path:
    """ENGINE_SHARED_DIR, or the `shared` folder beside the checkout (where CI and developers have it)."""
    env = os.environ.get("ENGINE_SHARED_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared"  # engine/codec/vectors.py -> beside the checkout


def load_vectors(vectors_dir=None):
    """Every captured frame, in capture order: a list of (client, index entry, whole frame bytes)."""
    root = Path(vectors_dir) if vectors_dir else shared_dir() / "vectors"
    out = []
    for index_path in sorted(root.glob("*/index.json")):
        index = json.loads(index_path.read_text())
        for entry in index["frames"]:
            out.append((index["client"], entry, (index_path.parent / entry["file"]).read_bytes()))
    return out
