"""Config per component: each tier and the engine own their section's schema next to
their code, the loader (kvstore.config) composes them, and a tier's schema comes
without the loader or the engine."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

import kvstore.config
from kvstore.configtypes import is_size_field
from kvstore.engine import config as engine_config
from kvstore.tiers import dramconfig, redisconfig
from kvstore.tiers.disk import config as disk_config

HOMES = {
    "DramConfig": dramconfig,
    "DiskConfig": disk_config,
    "RedisConfig": redisconfig,
    "EngineConfig": engine_config,
    "QuotaConfig": engine_config,
    "RetentionConfig": engine_config,
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_schema_lives_with_its_component_and_the_loader_re_exports_it(name: str) -> None:
    assert getattr(kvstore.config, name) is getattr(HOMES[name], name)
    assert name in kvstore.config.__all__


def test_every_name_the_loader_exports_is_there() -> None:
    for name in kvstore.config.__all__:
        assert getattr(kvstore.config, name) is not None, name


def test_tier_schemas_import_neither_the_loader_nor_the_engine() -> None:
    """A tier (the Redis tier included) sits below the engine and the loader: importing
    it and every tier schema must not pull either in; nor does the loader pull in a
    tier's heavy imports to read its schema."""
    code = (
        "import sys\n"
        "import kvstore.tiers.dramconfig, kvstore.tiers.redisconfig, kvstore.tiers.disk.config\n"
        "import kvstore.tiers.redis, kvstore.tiers.redisconn\n"
        "bad = sorted(m for m in sys.modules if m == 'kvstore.config'"
        " or m.startswith('kvstore.engine'))\n"
        "assert not bad, bad\n"
        "for m in [m for m in sys.modules if m.startswith('kvstore')]: del sys.modules[m]\n"
        "for m in ('numpy', 'msgspec', 'redis', 'grpc'): sys.modules.pop(m, None)\n"
        "import kvstore.config\n"
        "heavy = sorted(m for m in ('numpy', 'msgspec', 'redis', 'grpc') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


#: The fields the loader read as byte sizes before each component declared its own.
_SIZES_BY_NAME = {"capacity", "max_block_bytes", "max_message_bytes", "chunk_bytes",
                  "segment_size", "dram", "disk", "redis"}


def test_size_fields_are_declared_by_their_component_and_are_the_same_as_before() -> None:
    sections = [kvstore.config.ServerConfig, kvstore.config.DramConfig,
                kvstore.config.DiskConfig, kvstore.config.RedisConfig,
                kvstore.config.EngineConfig, kvstore.config.QuotaConfig,
                kvstore.config.RetentionConfig, kvstore.config.AuthConfig,
                kvstore.config.TlsConfig]
    for cls in sections:
        for f in fields(cls):
            assert is_size_field(f) == (f.name in _SIZES_BY_NAME), (cls.__name__, f.name)


def test_quota_and_retention_limits_share_one_parser() -> None:
    cfg = kvstore.config.load_config(env={
        "KVSTORE_RETENTION__DISK": "2MiB", "KVSTORE_RETENTION__REDIS": "0"}, overrides={
        "redis": {"enabled": True, "url": "redis://127.0.0.1:6379/0"},
        "quotas": [{"namespace_prefix": "a/", "disk": "2MiB", "redis": 0}]})
    assert cfg.retention.limits() == cfg.quotas[0].limits() == {"disk": 2 * 2**20}
    assert engine_config.tier_limits(cfg.retention) == {"disk": 2 * 2**20}
    assert engine_config.LIMIT_TIERS == ("dram", "disk", "redis")
