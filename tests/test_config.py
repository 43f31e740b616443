"""BrokerConfig: properties format, RocketMQ names, overrides, BrokerStartup's validations, `rmqhb serve -p`."""
import pytest

from engine.broker.config import PROPERTIES, BrokerConfig, ConfigError, parse_overrides, parse_properties


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


def test_slave_role_is_refused_no_ha(capsys):
    """Issue 18 item 5: a SLAVE was accepted and served clients as a master; there is no HA here."""
    from engine.broker.controller import serve_main

    with pytest.raises(ConfigError, match="brokerRole=SLAVE is not supported: this broker has no HA"):
        BrokerConfig.load(None, {"brokerRole": "SLAVE", "brokerId": "1"})
    for name in ("enableDLegerCommitLog", "enableControllerMode"):
        with pytest.raises(ConfigError, match=f"{name}=true is not supported: this broker has no HA"):
            BrokerConfig.load(None, {name: "true"})
        assert BrokerConfig.load(None, {name: "false"}).broker_id == 0
    for role in ("SYNC_MASTER", "ASYNC_MASTER"):
        assert BrokerConfig.load(None, {"brokerRole": role, "brokerId": "3"}).broker_id == 0  # MixAll.MASTER_ID
    with pytest.raises(ConfigError, match="brokerRole must be ASYNC_MASTER, SYNC_MASTER or SLAVE"):
        BrokerConfig.load(None, {"brokerRole": "slave"})
    assert serve_main(["--brokerRole", "SLAVE", "--brokerId", "1"]) == 253
    assert "brokerRole=SLAVE is not supported" in capsys.readouterr().err


@pytest.mark.parametrize("props, msg", [
    ({"listenPort": "abc"}, "listenPort must be an integer"),
    ({"listenPort": "70000"}, "listenPort must be between 0 and 65535"),
    ({"aclEnable": "yes"}, "aclEnable must be true or false"),
    ({"aclEnable": "true"}, "aclEnable=true needs aclFile"),
    ({"aclEnable": "true", "aclFile": "/nonexistent/plain_acl.yml"}, "does not exist"),
    ({"brokerIP1": "localhost"}, "brokerIP1 must be an IP literal"),
    ({"maxConnections": "0"}, "maxConnections must be > 0"),
    ({"maxConnections": str(16_000_000), "grpcMaxSessions": "777217"},
     r"maxConnections \+ grpcMaxSessions must be at most 16777216 \(the slots of the registry's channel table\), "
     "not 16777217"),
    ({"brokerRole": "MASTER"}, "brokerRole must be"),
    ({"channelExpiredTimeout": str((1 << 40) + 120_001)}, "channelExpiredTimeout must be at most 1099511747776 ms"),
    ({"maxGroupsPerChannel": "4097"}, "maxGroupsPerChannel must be between 1 and 4096"),
    ({"maxGroupsPerChannel": "0"}, "maxGroupsPerChannel must be between 1 and 4096"),
    ({"maxRegisteredGroups": "0"}, "maxRegisteredGroups must be between 1"),
    ({"maxRegisteredMemberships": "0"}, "maxRegisteredMemberships must be between 1"),
])
def test_invalid_values_are_clear_errors(props, msg):
    with pytest.raises(ConfigError, match=msg):
        BrokerConfig.load(None, props)


def test_connection_and_session_budgets_fit_the_channel_table():
    cfg = BrokerConfig.load(None, {"maxConnections": str(16_000_000), "grpcMaxSessions": "777216"})
    assert cfg.max_connections + cfg.grpc_max_sessions == 1 << 24


def test_registry_budgets_reach_the_registry(tmp_path):
    from engine.broker.controller import Broker

    cfg = BrokerConfig.load(None, {"maxGroupsPerChannel": "7", "maxRegisteredGroups": "99",
                                   "maxRegisteredMemberships": "1234", "storePathRootDir": str(tmp_path)})
    rc = Broker(cfg).registry.config
    assert (rc.max_groups_per_channel, rc.max_groups, rc.max_memberships) == (7, 99, 1234)


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
    from engine.broker.controller import serve_main

    f = tmp_path / "broker.properties"
    f.write_text("brokerName=broker-p\n")
    assert serve_main(["-c", str(f), "--listenPort", "12345", "-p"]) == 0
    out = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert out["brokerName"] == "broker-p" and out["listenPort"] == "12345" and out["aclEnable"] == "false"
    assert serve_main(["-c", str(f), "-m"]) == 0
    assert capsys.readouterr().out.splitlines() == ["brokerName=broker-p"]


def test_serve_reports_validation_errors(capsys):
    from engine.broker.controller import serve_main

    assert serve_main(["--namesrvAddr", "nonsense"]) == 253  # mqbroker: System.exit(-3)
    assert "The Name Server Address[nonsense] illegal" in capsys.readouterr().err


# ---- strictness (issue 12 item 8): names, numbers and escapes as the Java broker reads them


def test_unknown_property_is_an_error_with_the_closest_name(tmp_path):
    f = tmp_path / "broker.properties"
    f.write_text("listenPrt=10912\n")
    with pytest.raises(ConfigError, match="unknown property listenPrt: did you mean listenPort\\?"):
        BrokerConfig.load(f)
    with pytest.raises(ConfigError, match="did you mean listenPort"):
        BrokerConfig.load(overrides={"listenPrt": "1"})
    with pytest.raises(ConfigError, match="unknown option --listenPrt: did you mean listenPort"):
        parse_overrides(["--listenPrt", "10912"])
    with pytest.raises(ConfigError, match="not a property of this broker or of RocketMQ's"):
        BrokerConfig.load(overrides={"zzzqqq": "1"})


def test_lenient_switch_keeps_unknown_names(tmp_path):
    f = tmp_path / "broker.properties"
    f.write_text("listenPrt=10912\n")
    cfg = BrokerConfig.load(f, lenient=True)
    assert cfg.listen_port == 10911 and cfg.unused_properties() == ["listenPrt"]
    assert parse_overrides(["--whatever", "1"], lenient=True) == {"whatever": "1"}


def test_java_broker_properties_are_accepted_and_listed(tmp_path):
    f = tmp_path / "broker.properties"
    f.write_text("brokerClusterName=C\ndeleteWhen=04\nfileReservedTime=48\nflushDiskType=ASYNC_FLUSH\n"
                 "sendMessageThreadPoolNums=16\nstorePathCommitLog=/data/commitlog\n")
    cfg = BrokerConfig.load(f)
    assert cfg.broker_cluster_name == "C"
    assert cfg.unused_properties() == ["deleteWhen", "fileReservedTime", "flushDiskType",
                                       "sendMessageThreadPoolNums", "storePathCommitLog"]


def test_serve_lists_unused_properties_once_and_refuses_typos(tmp_path, capsys, caplog):
    import logging

    from engine.broker.controller import serve_main

    f = tmp_path / "broker.properties"
    f.write_text("listenPrt=10912\n")
    assert serve_main(["-c", str(f), "-p"]) == 253
    assert "did you mean listenPort?" in capsys.readouterr().err
    f.write_text("deleteWhen=04\n")
    caplog.set_level(logging.INFO)
    assert serve_main(["-c", str(f), "-p"]) == 0


@pytest.mark.parametrize("text", ["10_911", "\u0661\u0660\u0669\u0661\u0661", " 10911", "10911 ", "0x10", "1e3",
                                  "", "+", "-", "2147483648", "-2147483649", "10911.0", "+-1"])
def test_int_properties_parse_as_integer_parse_int(text):
    with pytest.raises(ConfigError, match="listenPort"):
        BrokerConfig().apply({"listenPort": text})


def test_int_properties_accept_what_java_accepts():
    cfg = BrokerConfig().apply({"listenPort": "+10911", "serverChannelMaxIdleTimeSeconds": "0120",
                                "channelExpiredTimeout": "9223372036854775807"})
    assert cfg.listen_port == 10911 and cfg.server_channel_max_idle_time_seconds == 120
    assert cfg.channel_expired_timeout == 2**63 - 1  # a Java long
    with pytest.raises(ConfigError, match="out of range for a Java long"):
        BrokerConfig().apply({"channelExpiredTimeout": "9223372036854775808"})


@pytest.mark.parametrize("text", ["k=\\u12", "k=\\u12g4", "k=\\u+123", "k=\\u0x12", "k=abc\\u"])
def test_malformed_unicode_escape_is_an_error_as_in_java(text):
    with pytest.raises(ConfigError, match="Malformed \\\\uxxxx encoding"):
        parse_properties(text)


def test_properties_escapes_and_lines_as_java_reads_them():
    text = ("a=\\u0041\\u00e9\\tx\n"       # escapes
            "b=\\ud83d\\ude00\n"            # an escaped surrogate pair is one character
            "c=one\\\n   two\n"             # continuation: the next line's leading whitespace is skipped
            "# comment \\\n"                # a comment line is never continued
            "d=\\q\\=\\:\n"                 # a backslash before another character is that character
            "e=x\u2028y\n"                  # U+2028 is not a line break for Properties.load
            "f=last\\")                     # a trailing backslash at the end of the file is dropped
    assert parse_properties(text) == {"a": "A\u00e9\tx", "b": "\U0001F600", "c": "onetwo", "d": "q=:",
                                      "e": "x\u2028y", "f": "last"}


# ---- start-up as mqbroker (issue 18 item 3)


@pytest.mark.parametrize("text, servers", [
    ("127.0.0.1:9876;", [("127.0.0.1", 9876)]),  # Java's split drops trailing empty strings
    ("127.0.0.1:9876;10.0.0.2:9877;;", [("127.0.0.1", 9876), ("10.0.0.2", 9877)]),
    ("127.0.0.1:9876; 10.0.0.2:9877", [("127.0.0.1", 9876), ("10.0.0.2", 9877)]),  # Java keeps " 10.0.0.2"
    ("  127.0.0.1:9876  ", [("127.0.0.1", 9876)]),  # the property value is trimmed (MixAll.properties2Object)
    ("127.0.0.1:+9876", [("127.0.0.1", 9876)]),  # Integer.parseInt takes a sign
    (":9876", [("127.0.0.1", 9876)]),  # InetAddress.getByName("") is the loopback address
    ("[::1]:9876", [("::1", 9876)]),
])
def test_namesrv_addr_is_parsed_as_java_does(text, servers):
    assert BrokerConfig.load(None, {"namesrvAddr": text}).namesrv_addr_list == servers


@pytest.mark.parametrize("text", [";127.0.0.1:9876", "127.0.0.1:9876;;10.0.0.2:9876", "127.0.0.1:9876 ;10.0.0.2:1",
                                  "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1: 9876", "a:1;b"])
def test_namesrv_addr_java_refuses(text):
    with pytest.raises(ConfigError, match=r"The Name Server Address\[.*\] illegal"):
        BrokerConfig.load(None, {"namesrvAddr": text})


def test_serve_exit_statuses_are_mqbrokers(tmp_path, capsys):
    """BrokerStartup: System.exit(-3) (253) for an illegal namesrvAddr, a slave's brokerId and a failed initialize();
    System.exit(-1) (255) for a bad command line, an unreadable config file and a failed start."""
    import socket

    from engine.broker.controller import EXIT_CONFIG, EXIT_FAILURE, serve_main

    assert (EXIT_CONFIG, EXIT_FAILURE) == (253, 255)
    assert serve_main(["--namesrvAddr", "127.0.0.1"]) == 253
    assert serve_main(["--brokerRole", "SYNC_MASTER", "--listenPort", "x"]) == 253
    assert serve_main(["-c", str(tmp_path / "missing.properties")]) == 255
    assert "cannot read config file" in capsys.readouterr().err
    assert serve_main(["-c"]) == 255  # -c without its argument
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        args = ["--listenPort", str(busy.getsockname()[1]), "--listenHost", "127.0.0.1", "--fastPortEnable", "false",
                "--storePathRootDir", str(tmp_path / "store"), "--log-level", "CRITICAL"]
        assert serve_main(args) == 255  # BrokerController.start() threw
    finally:
        busy.close()


def test_serve_lists_java_properties_it_does_not_use_once(tmp_path, caplog):
    import logging
    import socket

    from engine.broker.controller import serve_main

    f = tmp_path / "broker.properties"
    f.write_text("sendMessageThreadPoolNums=16\npullMessageThreadPoolNums=32\ndeleteWhen=04\nlistenPrt=1\n"
                 "brokerName=b\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    caplog.set_level(logging.INFO, logger="engine.broker.controller")
    try:
        args = ["-c", str(f), "--lenient-config", "--listenPort", str(busy.getsockname()[1]), "--listenHost",
                "127.0.0.1", "--fastPortEnable", "false", "--storePathRootDir", str(tmp_path / "store")]
        assert serve_main(args) == 255  # listed at start, before the failed bind
    finally:
        busy.close()
    lines = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert lines == ["accepted, not used by this broker: deleteWhen, pullMessageThreadPoolNums, "
                     "sendMessageThreadPoolNums",
                     "unknown properties kept (--lenient-config), not used: listenPrt"]
