"""The plugin's pure parts (no LMCache needed): key mapping and settings."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from kvstore.connectors.lmcache import ChunkLayout, KeyMapper, PluginConfig, block_hash_of

from kvstore.errors import ConfigError


@dataclass(frozen=True)
class Key:
    """The attributes of LMCache's CacheEngineKey the mapping reads."""

    model_name: str = "meta-llama/Llama-3.1-8B"
    world_size: int = 2
    worker_id: int = 0
    chunk_hash: Any = 0x1234
    dtype: str = "torch.bfloat16"
    tags: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class LayerKey(Key):
    layer_id: int = 0


LAYOUT = ChunkLayout(shapes=((2, 32, 256, 1024),), dtypes=("bfloat16",), fmt="KV_2LTD",
                     chunk_size=256)


def test_every_part_of_a_keys_identity_but_the_hash_splits_namespaces() -> None:
    m = KeyMapper("default", LAYOUT)
    base = Key()
    variants = [
        replace(base, model_name="other"), replace(base, world_size=4),
        replace(base, worker_id=1), replace(base, dtype="torch.float16"),
        replace(base, tags=(("cache_salt", "alice"),)),
        replace(base, tags=(("cache_salt", "bob"),)),
        LayerKey(layer_id=0), LayerKey(layer_id=1),
    ]
    namespaces = [m.namespace(k) for k in [base, *variants]]
    assert len(set(namespaces)) == len(namespaces)
    assert m.namespace(replace(base, chunk_hash=99)) == m.namespace(base)
    assert KeyMapper("acme", LAYOUT).namespace(base) != m.namespace(base)
    other_layout = replace(LAYOUT, shapes=((2, 32, 256, 512),))
    assert KeyMapper("default", other_layout).namespace(base) != m.namespace(base)


def test_namespace_reads_tenant_model_and_rank() -> None:
    ns = KeyMapper("acme", LAYOUT).namespace(Key(worker_id=1))
    prefix, tenant, model, digest, parallel = ns.split("/")
    assert (prefix, tenant, model, parallel) == ("lmcache", "acme", "Llama-3.1-8B", "tp1of2")
    assert len(digest) == 16
    assert KeyMapper("acme", LAYOUT).namespace(LayerKey(layer_id=3)).endswith("/tp0of2/layer3")


def test_chunk_hash_becomes_its_64_bit_block_hash() -> None:
    assert block_hash_of(0x1234) == (0x1234).to_bytes(8, "big")
    assert block_hash_of(-1) == b"\xff" * 8  # Python's hash() is signed
    assert block_hash_of(2**64 - 1) == b"\xff" * 8
    wide = block_hash_of(2**200 + 5)  # not a 64-bit hash: folded, still 8 bytes
    assert len(wide) == 8 and wide != block_hash_of(5)
    assert len(block_hash_of(b"\x01" * 32)) == 8
    assert KeyMapper("t", LAYOUT).block_hash(Key(chunk_hash=7)) == (7).to_bytes(8, "big")


def test_runs_cut_keys_by_namespace_in_order() -> None:
    m = KeyMapper("t", LAYOUT)
    a, b = Key(), Key(worker_id=1)
    keys = [a, a, b, a]
    runs = [(ns, list(r)) for ns, r in m.runs(keys)]
    assert runs == [(m.namespace(a), [0, 1]), (m.namespace(b), [2]), (m.namespace(a), [3])]
    assert list(m.runs([])) == []


def test_settings_come_from_the_plugins_prefix() -> None:
    extra = {
        "remote_storage_plugin.kvstore.module_path": "kvstore.connectors.lmcache",
        "remote_storage_plugin.kvstore.class_name": "KVStoreConnectorAdapter",
        "remote_storage_plugin.kvstore.address": "10.0.0.5:6000",
        "remote_storage_plugin.kvstore.timeout_s": "0.5",  # LMCache env overrides: strings
        "remote_storage_plugin.kvstore.threads": 4,
        "remote_storage_plugin.kvstore.prefault": "false",
        "remote_storage_plugin.kvstore.zero_copy": False,
        "remote_storage_plugin.kvstore.hold_ahead_s": "0",
        "remote_storage_plugin.kvstore.cache_ttl_s": "300",
        "remote_storage_plugin.kvstore.primary.tenant": "acme",
        "remote_storage_plugin.fs.base_path": "/elsewhere",  # another plugin's: ignored
        "save_chunk_meta": True,
    }
    cfg = PluginConfig.from_extra_config(extra)
    assert (cfg.address, cfg.timeout_s, cfg.threads, cfg.tenant) == ("10.0.0.5:6000", 0.5, 4,
                                                                     "default")
    assert cfg.prefault is False and PluginConfig().prefault is True
    assert cfg.zero_copy is False and PluginConfig().zero_copy is True
    assert cfg.hold_ahead_s == 0.0 and PluginConfig().hold_ahead_s == 1.0
    assert cfg.cache_ttl_s == 300.0 and PluginConfig().cache_ttl_s == 0.0
    primary = PluginConfig.from_extra_config(extra, "kvstore.primary")  # instance over type
    assert (primary.address, primary.tenant) == ("10.0.0.5:6000", "acme")
    assert PluginConfig.from_extra_config(None) == PluginConfig()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("adress", "h:1", "unknown setting 'adress'"),
    ("address", "nohost", "address must be 'host:port'"),
    ("timeout_s", 0, "timeout_s must be > 0"),
    ("timeout_s", "soon", "must be float"),
    ("threads", 1.5, "must be int"),
    ("threads", 0, "threads must be >= 1"),
    ("prefault", "maybe", "must be bool"),
    ("zero_copy", 2, "must be bool"),
    ("hold_ahead_s", -1, "hold_ahead_s must be between 0 and 60 s"),
    ("hold_ahead_s", 600, "hold_ahead_s must be between 0 and 60 s"),
    ("cache_ttl_s", -1, "cache_ttl_s must be between 0 and 604800 s"),
    ("cache_ttl_s", "an hour", "must be float"),
    ("tenant", "", "tenant must be a non-empty string"),
    ("workload", "gaming", "unknown workload 'gaming'"),
])
def test_bad_settings_are_refused_by_name(key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PluginConfig.from_extra_config({f"remote_storage_plugin.kvstore.{key}": value})


def test_the_readme_lists_every_setting_with_its_default() -> None:
    """The README's settings table is what users copy from: it must match the code."""
    import re
    from dataclasses import fields as dc_fields
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("| setting (`remote_storage_plugin.kvstore.*`) | default | meaning |")[1]
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", table.split("\n\n")[0], re.M))
    defaults = PluginConfig()
    want = {f.name: str(getattr(defaults, f.name)) for f in dc_fields(PluginConfig)}
    want = {k: v.lower() if v in ("True", "False") else v for k, v in want.items()}
    assert rows == want
