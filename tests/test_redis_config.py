"""The [redis] config section: defaults, TOML and env forms, errors that name the field."""

from __future__ import annotations

import pytest

from kvstore.config import load_config
from kvstore.errors import ConfigError


def test_off_by_default_and_needs_nothing():
    cfg = load_config(env={})
    assert not cfg.redis.enabled and cfg.redis.capacity == 4 * 2**30
    assert cfg.redis.chunk_bytes == 4 * 2**20 and cfg.redis.ttl_seconds == 3600


def test_toml_and_env(tmp_path):
    f = tmp_path / "kv.toml"
    f.write_text('[redis]\nenabled = true\ncluster_nodes = ["10.0.0.1:7000", "10.0.0.2:7000"]\n'
                 'chunk_bytes = "1MiB"\nttl_seconds = 60\n')
    cfg = load_config(f, env={"KVSTORE_REDIS__PASSWORD": "s3cret",
                              "KVSTORE_REDIS__CAPACITY": "2GiB"})
    assert cfg.redis.cluster and cfg.redis.cluster_nodes == ("10.0.0.1:7000", "10.0.0.2:7000")
    assert cfg.redis.password == "s3cret" and cfg.redis.capacity == 2 * 2**30
    assert cfg.redis.chunk_bytes == 2**20 and cfg.redis.ttl_seconds == 60.0
    env = load_config(env={"KVSTORE_REDIS__ENABLED": "1",
                           "KVSTORE_REDIS__CLUSTER_NODES": "a:1, b:2"})
    assert env.redis.cluster_nodes == ("a:1", "b:2")
    url = load_config(env={}, overrides={"redis": {"enabled": True,
                                                   "url": "rediss://u:p@cache:6380/2"}})
    assert not url.redis.cluster
    only_redis = load_config(env={}, overrides={
        "dram": {"enabled": False}, "disk": {"enabled": False},
        "redis": {"enabled": True, "url": "redis://h:1/0"}})
    assert only_redis.redis.enabled


@pytest.mark.parametrize(("redis", "message"), [
    ({"enabled": True}, "redis.url / redis.cluster_nodes: set exactly one"),
    ({"enabled": True, "url": "redis://h:1/0", "cluster_nodes": ["h:1"]}, "set exactly one"),
    ({"url": "http://h:1/0"}, "redis.url: expected redis://HOST:PORT/DB"),
    ({"url": "redis://h:1/zero"}, "redis.url: expected redis://HOST:PORT/DB"),
    ({"url": "redis://h:99999/0"}, "redis.url: not a URL"),
    ({"cluster_nodes": ["nohost"]}, "redis.cluster_nodes: expected HOST:PORT"),
    ({"cluster_nodes": 7}, "redis.cluster_nodes: expected a list of strings"),
    ({"chunk_bytes": "1KiB"}, "redis.chunk_bytes: expected 64KiB to 512MiB"),
    ({"capacity": 0}, "redis.capacity: must be > 0"),
    ({"timeout": 0}, "redis.timeout: must be > 0"),
    ({"ttl_seconds": -1}, "redis.ttl_seconds: must be >= 0"),
    ({"key_prefix": "a{b}"}, "redis.key_prefix: expected letters"),
    ({"colour": 1}, "redis.colour: unknown field"),
])
def test_bad_values_name_the_field(redis, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("/", r"\/")):
        load_config(env={}, overrides={"redis": redis})


@pytest.mark.parametrize("source", ["toml", "env"])
@pytest.mark.parametrize("where", ["url", "cluster_nodes"])
def test_an_address_without_enabled_is_refused_naming_redis_enabled(tmp_path, source, where):
    # Refused, never run without the tier it names, and never enabled on its own (the
    # default cannot be told from an explicit "enabled = false"): README, Configuration.
    value = {"url": '"redis://cache:6379/0"', "cluster_nodes": '["10.0.0.1:7000"]'}[where]
    f = tmp_path / "kv.toml"
    if source == "toml":
        f.write_text(f"[redis]\n{where} = {value}\n")
        env = {}
    else:
        f.write_text("")
        env = {f"KVSTORE_REDIS__{where.upper()}": value.strip('"[]').replace('"', "")}
    with pytest.raises(ConfigError, match=rf"^redis\.enabled: redis\.{where} is set but "
                                          r"redis\.enabled is false"):
        load_config(f, env=env)
    explicit_off = load_config(env={}, overrides={"redis": {"enabled": False}})
    assert not explicit_off.redis.enabled  # off with no address: still fine
