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


def test_demo_names_its_directory_once_and_keeps_the_broker_log_apart(tmp_path, capsys):
    """Issue 29 §2: the working directory is named once (and said to be kept, with its size at the end); the
    embedded broker's log lines go to broker.log there, not between the demo's own lines."""
    work = tmp_path / "work"
    assert demo_main(["--no-spark", "--records", "20000", "--work", str(work)]) == 0
    captured = capsys.readouterr()
    assert captured.out.count(str(work)) == 1
    assert "kept afterwards" in captured.out and "the working directory above holds" in captured.out
    # the flapping client's dropped connections are logged by the broker: in its file, not on the terminal
    log = (work / "broker.log").read_text()
    assert "NETTY EVENT: remove not active channel" in log
    assert "NETTY EVENT" not in captured.out + captured.err
    assert f"broker log: {log.count(chr(10))} lines in broker.log" in captured.out
