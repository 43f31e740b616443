"""The admin CLI's ACL secret never comes from argv (ps, shell history): a file or $RMQHB_SECRET_KEY."""
import json

import pytest

from engine.broker.admin import consumer_connection_main, producer_connection_main
from test_server import Client, broker_factory, sign_request  # noqa: F401  (fixtures)

ACL = ("accounts:\n  - accessKey: opsadmin\n    secretKey: s3cr3t-value\n    admin: true\n"
       "    defaultTopicPerm: PUB|SUB\n    defaultGroupPerm: PUB|SUB\n")


@pytest.fixture
def acl_broker(broker_factory, tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    return broker_factory(acl_enable=True, acl_file=str(acl))


def _register(b):
    import engine
    from engine.codec.enums import RequestCode
    from test_server import hb_body

    c = Client(b.ports["main"])
    cmd = engine.RemotingCommand(RequestCode.HEART_BEAT, opaque=5, ext_fields={}, body=hb_body(client_id="m@1"))
    sign_request(cmd, "opsadmin", "s3cr3t-value")
    c.sock.sendall(cmd.encode())
    assert c.read(pred=lambda x: x.is_response and x.opaque == 5).code == 0
    return c


@pytest.mark.parametrize("main, extra", [(consumer_connection_main, ["-g", "demo_consumer_group"]),
                                         (producer_connection_main, ["-g", "demo_producer_group", "-t", "T"])])
def test_secret_on_the_command_line_is_refused(acl_broker, main, extra, capsys, monkeypatch):
    monkeypatch.delenv("RMQHB_SECRET_KEY", raising=False)
    rc = main([*extra, "-b", f"127.0.0.1:{acl_broker.ports['main']}", "--access-key", "opsadmin",
               "--secret-key", "s3cr3t-value"])
    err = capsys.readouterr().err
    assert rc == 1 and "--secret-key is not accepted" in err and "--secret-key-file" in err
    assert "RMQHB_SECRET_KEY" in err and "s3cr3t-value" not in err


def test_secret_from_the_environment(acl_broker, capsys, monkeypatch):
    c = _register(acl_broker)
    try:
        monkeypatch.setenv("RMQHB_SECRET_KEY", "s3cr3t-value")
        assert consumer_connection_main(["-g", "demo_consumer_group", "-b", f"127.0.0.1:{acl_broker.ports['main']}",
                                         "--access-key", "opsadmin", "--json"]) == 0
        assert [x["clientId"] for x in json.loads(capsys.readouterr().out)["connectionSet"]] == ["m@1"]
    finally:
        c.close()


def test_secret_from_a_file(acl_broker, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("RMQHB_SECRET_KEY", raising=False)
    c = _register(acl_broker)
    try:
        f = tmp_path / "secret"
        f.write_text("s3cr3t-value\n")
        f.chmod(0o600)
        addr = f"127.0.0.1:{acl_broker.ports['main']}"
        assert consumer_connection_main(["-g", "demo_consumer_group", "-b", addr, "--access-key", "opsadmin",
                                         "--secret-key-file", str(f), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["connectionSet"][0]["clientId"] == "m@1"
        # no secret anywhere: a clear error, no request sent unsigned
        assert consumer_connection_main(["-g", "demo_consumer_group", "-b", addr, "--access-key", "opsadmin"]) == 1
        assert "RMQHB_SECRET_KEY" in capsys.readouterr().err
    finally:
        c.close()
