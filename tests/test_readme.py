"""The README's configuration table is the one engine/broker/config.py describes (scripts/config_table.py)."""
import subprocess
import sys

from conftest import ROOT


def test_config_table_is_current():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_table.py"), "--check"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr


def test_every_property_is_documented():
    sys.path.insert(0, str(ROOT / "scripts"))
    import config_table

    undocumented = [row for row in config_table.table().splitlines()[2:] if row.endswith("|  |")]
    assert undocumented == []
