"""Config: embedded defaults, TOML, env overrides, errors that name the field."""

from __future__ import annotations

import pytest

from kvstore.config import load_config, parse_size
from kvstore.errors import ConfigError


def test_embedded_defaults_need_nothing():
    cfg = load_config(env={})
    assert cfg.server.listen == "127.0.0.1:50051"
    assert cfg.dram.enabled and cfg.disk.enabled
    assert cfg.dram.capacity == 2**30 and cfg.disk.capacity == 10 * 2**30
    assert str(cfg.disk_path).endswith("kvstore-data/disk")
    assert cfg.engine.policy == "adaptive"


def test_toml_then_env_then_overrides(tmp_path):
    f = tmp_path / "kv.toml"
    f.write_text('data_dir = "/x"\n[dram]\ncapacity = "2GiB"\n[server]\nlisten = "0.0.0.0:1"\n')
    cfg = load_config(f, env={"KVSTORE_DRAM__CAPACITY": "3GiB", "KVSTORE_LOG_LEVEL": "debug"},
                      overrides={"server": {"listen": "127.0.0.1:2"}})
    assert cfg.data_dir == "/x" and cfg.dram.capacity == 3 * 2**30
    assert cfg.server.listen == "127.0.0.1:2" and cfg.log_level == "debug"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"dram": {"capacity": "lots"}}, "dram.capacity: expected a size"),
    ({"dram": {"capacity": 0}}, "dram.capacity: must be > 0"),
    ({"server": {"listen": "nowhere"}}, "server.listen: expected HOST:PORT"),
    ({"server": {"metrics_port": 70000}}, "server.metrics_port"),
    ({"server": {"max_block_bytes": "100MiB"}}, "must exceed server.max_block_bytes"),
    ({"engine": {"policy": "fifo9"}}, "engine.policy: unknown policy 'fifo9'; valid: "),
    ({"dram": {"colour": "red"}}, "dram.colour: unknown field; valid: "),
    ({"nonsense": 1}, "nonsense: unknown setting"),
    ({"dram": {"enabled": "maybe"}}, "dram.enabled: expected bool"),
    ({"dram": {"enabled": False}, "disk": {"enabled": False}}, "at least one tier"),
    ({"log_level": "LOUD"}, "log_level"),
])
def test_bad_values_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(env={}, overrides=overrides)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[dram\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})


def test_sizes():
    assert parse_size("64MiB", "x") == 64 * 2**20
    assert parse_size("1.5GB", "x") == 1_500_000_000
    assert parse_size(4096, "x") == 4096


def test_env_reads_only_our_settings():
    cfg = load_config(env={"KVSTORE_BIN": "/x", "KVSTORE_VLLM_PYTHON": "/y",
                           "KVSTORE_VLLM__THING": "1", "KVSTORE_DISK__CAPACITY": "2GiB"})
    assert cfg.disk.capacity == 2 * 2**30
    with pytest.raises(ConfigError, match="dram.capacty: unknown field"):
        load_config(env={"KVSTORE_DRAM__CAPACTY": "1GiB"})


def test_quotas_from_toml(tmp_path):
    assert load_config(env={}).quotas == ()  # none by default
    f = tmp_path / "kv.toml"
    f.write_text('[[quotas]]\nnamespace_prefix = "tenant-a/"\ndram = "512MiB"\n'
                 'disk = "2GiB"\n\n[[quotas]]\nnamespace_prefix = "tenant-b/"\ndisk = 4096\n')
    a, b = load_config(f, env={}).quotas
    assert a.namespace_prefix == "tenant-a/" and a.limits() == {
        "dram": 512 * 2**20, "disk": 2 * 2**30}
    assert b.limits() == {"disk": 4096}


@pytest.mark.parametrize(("quotas", "message"), [
    ({"namespace_prefix": "a/"}, "quotas[0]: set at least one of dram, disk, redis"),
    ({"dram": "1GiB"}, "quotas[0].namespace_prefix: must be a non-empty string"),
    ({"namespace_prefix": "a/", "dram": "lots"}, "quotas[0].dram: expected a size"),
    ({"namespace_prefix": "a/", "ram": 1}, "quotas[0].ram: unknown field; valid: "),
    ({"namespace_prefix": "a/", "redis": "1GiB"},
     "quotas[0].redis: a limit for a tier that is not enabled"),
])
def test_bad_quotas_name_the_field(quotas, message):
    import re

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(env={}, overrides={"quotas": [quotas]})
    with pytest.raises(ConfigError, match=re.escape("appears twice")):
        load_config(env={}, overrides={"quotas": [{"namespace_prefix": "a/", "dram": 1}] * 2})
    with pytest.raises(ConfigError, match=re.escape("quotas: expected an array of tables")):
        load_config(env={}, overrides={"quotas": {"namespace_prefix": "a/"}})


def test_dram_segment_mode_and_group():
    cfg = load_config(env={})
    assert (cfg.dram.mode, cfg.dram.gid()) == (0o600, None)  # the server's user only
    shared = load_config(env={"KVSTORE_DRAM__SEGMENT_MODE": "0660",
                              "KVSTORE_DRAM__SEGMENT_GROUP": "10000"})
    assert (shared.dram.mode, shared.dram.gid()) == (0o660, 10000)
    assert load_config(env={}, overrides={"dram": {"segment_mode": "0660",
                                                   "segment_group": "root"}}).dram.gid() == 0


@pytest.mark.parametrize(("dram", "message"), [
    ({"segment_mode": "0666"}, "dram.segment_mode: expected one of '0600', '0660'"),
    ({"segment_mode": 0o660}, "dram.segment_mode: expected one of .* got '432'"),
    ({"segment_group": "10000"}, "dram.segment_group: '10000' cannot map a 0600 segment"),
    ({"segment_mode": "0660", "segment_group": "no-such-group-here"},
     "dram.segment_group: no group 'no-such-group-here'"),
])
def test_bad_dram_segment_settings_name_the_field(dram, message):
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, overrides={"dram": dram})


def test_retention_section_is_typed_and_names_its_fields() -> None:
    cfg = load_config(env={}, overrides={"retention": {"max_ttl_s": 600, "dram": "256MiB"}})
    assert cfg.retention.max_ttl_s == 600.0 and cfg.retention.limits() == {"dram": 256 * 2**20}
    assert load_config(env={"KVSTORE_RETENTION__FRACTION": "0.25"}).retention.fraction == 0.25
    for bad, field in (({"max_ttl_s": -1}, "retention.max_ttl_s"),
                       ({"fraction": 1.5}, "retention.fraction"),
                       ({"dram": "lots"}, "retention.dram"),
                       ({"ttl": 5}, "retention.ttl: unknown field")):
        with pytest.raises(ConfigError, match=field):
            load_config(env={}, overrides={"retention": bad})
