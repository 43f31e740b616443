"""BrokerConfig: properties format, RocketMQ names, overrides, BrokerStartup's validations, `rmqhb serve -p`."""
import pytest

from engine.config import PROPERTIES, BrokerConfig, ConfigError, parse_overrides, parse_properties


def test_properties_format_like_java_util_properties():
    text = (
        "# comment\n! also a comment\n"
        "brokerName = broker-a\n"
        "brokerClusterName:DefaultCluster\n"
        "namesrvAddr 127.0.0.1:9876\n"
        "storePathRootDir=/tmp/a\\\n    b\n"
        "key\\ with\\ space=v\\u00e9\\t\n"
        "empty=\n"
    )
    props = parse_properties(text)
    assert props == {
        "brokerName": "broker-a",
        "brokerClusterName": "DefaultCluster",
        "namesrvAddr": "127.0.0.1:9876",
        "storePathRootDir": "/tmp/ab",
        "key with space": "v\u00e9\t",
        "empty": "",
    }


def test_load_file_then_overrides(tmp_path):
    f = tmp_path / "broker.properties"
    f.write_text("brokerName=broker-b\nlistenPort=20911\naclEnable=false\nflushDiskType=ASYNC_FLUSH\n")
    cfg = BrokerConfig.load(f, {"listenPort": "30911", "brokerId": "3"})
    assert cfg.broker_name == "broker-b"
    assert cfg.listen_port == 30911 and cfg.fast_listen_port == 30909
    assert cfg.broker_id == 0  # ASYNC_MASTER forces MixAll.MASTER_ID
    assert cfg.extra == {"flushDiskType": "ASYNC_FLUSH"}  # unknown to us, kept as Java keeps it
    assert {"brokerName", "listenPort", "aclEnable", "brokerId"} <= cfg.explicit


def test_defaults_match_rocketmq():
    cfg = BrokerConfig()
    assert cfg.listen_port == 10911 and cfg.fast_listen_port == 10909
    assert cfg.channel_expired_timeout == 120_000
    assert cfg.broker_cluster_name == "DefaultCluster"
    assert cfg.auto_create_subscription_group is True and cfg.acl_enable is False
    assert cfg.register_name_server_period == 30_000
    assert "listenPort" in PROPERTIES and "brokerIP1" in PROPERTIES and "namesrvAddr" in PROPERTIES


@pytest.mark.parametrize("addr", ["foo", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:9876;bad", "1.2.3.4:70000"])
def test_namesrv_addr_validation_message(addr):
    with pytest.raises(ConfigError) as e:
        BrokerConfig.load(None, {"namesrvAddr": addr})
    assert str(e.value) == (f"The Name Server Address[{addr}] illegal, please set it as follows, "
                            '"127.0.0.1:9876;192.168.0.1:9876"')


def test_namesrv_addr_list():
    cfg = BrokerConfig.load(None, {"namesrvAddr": "127.0.0.1:9876;10.0.0.2:9877"})
    assert cfg.namesrv_addr_list == [("127.0.0.1", 9876), ("10.0.0.2", 9877)]


def test_slave_needs_positive_broker_id():
    with pytest.raises(ConfigError, match="^Slave's brokerId must be > 0$"):
        BrokerConfig.load(None, {"brokerRole": "SLAVE"})
    assert BrokerConfig.load(None, {"brokerRole": "SLAVE", "brokerId": "1"}).broker_id == 1


@pytest.mark.parametrize("props, msg", [
    ({"listenPort": "abc"}, "listenPort must be an integer"),
    ({"listenPort": "70000"}, "listenPort must be between 0 and 65535"),
    ({"aclEnable": "yes"}, "aclEnable must be true or false"),
    ({"aclEnable": "true"}, "aclEnable=true needs aclFile"),
    ({"aclEnable": "true", "aclFile": "/nonexistent/plain_acl.yml"}, "does not exist"),
    ({"brokerIP1": "localhost"}, "brokerIP1 must be an IP literal"),
    ({"maxConnections": "0"}, "maxConnections must be > 0"),
    ({"brokerRole": "MASTER"}, "brokerRole must be"),
])
def test_invalid_values_are_clear_errors(props, msg):
    with pytest.raises(ConfigError, match=msg):
        BrokerConfig.load(None, props)


def test_register_period_is_clamped_like_broker_controller():
    assert BrokerConfig.load(None, {"registerNameServerPeriod": "1000"}).register_name_server_period == 10_000
    assert BrokerConfig.load(None, {"registerNameServerPeriod": "600000"}).register_name_server_period == 60_000


def test_overrides_syntax():
    assert parse_overrides(["--listenPort", "1", "--brokerName=x", "-n", "1.2.3.4:9876"]) == {
        "listenPort": "1", "brokerName": "x", "namesrvAddr": "1.2.3.4:9876"}
    with pytest.raises(ConfigError, match="unknown option --nosuch"):
        parse_overrides(["--nosuch", "1"])
    with pytest.raises(ConfigError, match="needs a value"):
        parse_overrides(["--listenPort"])


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        BrokerConfig.load(tmp_path / "nope.properties")


def test_serve_print_config(tmp_path, capsys):
    from engine.broker import serve_main

    f = tmp_path / "broker.properties"
    f.write_text("brokerName=broker-p\n")
    assert serve_main(["-c", str(f), "--listenPort", "12345", "-p"]) == 0
    out = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert out["brokerName"] == "broker-p" and out["listenPort"] == "12345" and out["aclEnable"] == "false"
    assert serve_main(["-c", str(f), "-m"]) == 0
    assert capsys.readouterr().out.splitlines() == ["brokerName=broker-p"]


def test_serve_reports_validation_errors(capsys):
    from engine.broker import serve_main

    assert serve_main(["--namesrvAddr", "nonsense"]) == 3
    assert "The Name Server Address[nonsense] illegal" in capsys.readouterr().err
