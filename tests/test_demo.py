"""The README's main job (rmqhb demo) runs end to end on its embedded defaults (Spark part: tests/test_spark*)."""
from engine.demo import demo_main


def test_demo_without_spark(tmp_path, capsys):
    assert demo_main(["--no-spark", "--records", "20000", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # the captures of both real clients were decoded
    assert "== ali-ons:" in out and "== cpp-rocketmq-0.4.4:" in out
    # the live fleet registered and was listed over the wire, with the deviating member's extra topic
    assert "127.0.0.1@demo-odd" in out and "TopicExtra" in out
    assert "NOTIFY_CONSUMER_IDS_CHANGED received: 0" not in out
    # the recorder captured every accepted heartbeat readably
    assert "recorder: OK" in out
    assert (tmp_path / "synthetic-recording" / "manifest.json").exists()
