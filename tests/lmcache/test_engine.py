"""Real ``LMCacheEngine`` s (lmcache 0.5.6, CPU tensors, in the LMCache venv) store and
retrieve through the plugin against a real sidecar (in-process, or ``kvstore serve``).

Each prompt is 4 chunks of 256 tokens; an engine with ``local_cpu`` off keeps nothing
itself, so every hit it reports came from the sidecar.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from kvstore import KVStoreClient

from .conftest import Driver

pytestmark = pytest.mark.slow

TOKENS = 1024
CHUNKS = 4


def _engine(driver: Driver, name: str, address: str, **args: Any) -> None:
    out = driver.call("engine", name=name, address=address, **args)
    assert out["connected_remotes"] == 1, out  # LMCache built the plugin's connector


def test_a_bad_setting_leaves_lmcache_running_without_the_plugin(server: Any,
                                                                 driver: Driver) -> None:
    out = driver.call("engine", name="bad", address=server.address, local_cpu=True,
                      settings={"adress": server.address})
    assert "RemoteBackend-kvstore" in out["backends"] and out["connected_remotes"] == 0
    assert "unknown setting 'adress'" in driver.log_tail(200_000)  # LMCache logged why
    _store(driver, "bad", prompt=1, kv_seed=11)
    assert _retrieve(driver, "bad", 1, kv_seed=11)["hit_tokens"] == TOKENS  # its own cache


def _store(driver: Driver, name: str, prompt: int, kv_seed: int, salt: str = "") -> dict[str, Any]:
    out = driver.call("store", name=name, prompt=prompt, kv_seed=kv_seed, salt=salt)
    assert out["flushed"], "the puts LMCache fired did not end"
    assert out["chunks"] == CHUNKS
    return out


def _retrieve(driver: Driver, name: str, prompt: int, kv_seed: int,
              salt: str = "") -> dict[str, Any]:
    out = driver.call("retrieve", name=name, prompt=prompt, kv_seed=kv_seed, salt=salt)
    assert out["equal"], f"retrieved bytes differ from the stored ones: {out}"
    return out


def test_a_fresh_engine_retrieves_every_chunk_with_identical_bytes(server: Any,
                                                                     driver: Driver) -> None:
    _engine(driver, "a", server.address)
    _store(driver, "a", prompt=1, kv_seed=11)
    with KVStoreClient(server.address, shared_memory=False) as c:
        st = c.stats()
    assert st.blocks == CHUNKS and st.namespaces == 1
    assert st.tier("dram").used_bytes == CHUNKS * 2 * 4 * 256 * 128 * 2  # KV_2LTD bf16

    _engine(driver, "b", server.address)  # fresh, keeps nothing locally
    out = _retrieve(driver, "b", prompt=1, kv_seed=11)
    assert out["hit_tokens"] == TOKENS
    link = driver.call("link", name="b")
    assert link["shared_memory"] is True  # co-located: shm plane
    # No local cache: LMCache loaded the sidecar's slots themselves, no copy, and
    # freeing them ended the read lease.
    assert link["zero_copy"] is True and link["handed"] == {"held": CHUNKS, "copied": 0}
    # The contains took the read lease in its own round trip; the get used those slots.
    assert link["ahead"] == {"taken": CHUNKS, "unused": 0} and link["ahead_now"] == 0
    assert _leases_end(server)
    assert _retrieve(driver, "b", prompt=2, kv_seed=11)["hit_tokens"] == 0  # never stored


def test_slots_held_by_a_lookup_that_no_get_follows_are_let_go(server: Any,
                                                                 driver: Driver) -> None:
    """LMCache's scheduler-side lookup asks contains and nothing more: the slots it
    held ahead go back after hold_ahead_s; hold_ahead_s 0 holds nothing ahead and
    still hands the get the slots themselves."""
    _engine(driver, "a", server.address)
    _store(driver, "a", prompt=5, kv_seed=55)
    _engine(driver, "b", server.address, settings={"hold_ahead_s": 0.3})
    assert driver.call("lookup", name="b", prompt=5)["hit_tokens"] == TOKENS
    link = driver.call("link", name="b")
    assert link["ahead_now"] == CHUNKS and len(server.engine.leases) == 1
    assert _leases_end(server)
    assert driver.call("link", name="b")["ahead"] == {"taken": 0, "unused": CHUNKS}
    # A retrieve after that holds again and hands over the new slots.
    assert _retrieve(driver, "b", prompt=5, kv_seed=55)["hit_tokens"] == TOKENS
    link = driver.call("link", name="b")
    assert link["ahead"] == {"taken": CHUNKS, "unused": CHUNKS}
    assert link["handed"] == {"held": CHUNKS, "copied": 0}
    _engine(driver, "c", server.address, settings={"hold_ahead_s": 0})
    assert _retrieve(driver, "c", prompt=5, kv_seed=55)["hit_tokens"] == TOKENS
    link = driver.call("link", name="c")
    assert link["ahead"] == {"taken": 0, "unused": 0}
    assert link["handed"] == {"held": CHUNKS, "copied": 0}
    assert _leases_end(server)


def test_cache_ttl_s_retains_every_chunk_the_plugin_stores(server: Any,
                                                          driver: Driver) -> None:
    """The plugin's ``cache_ttl_s`` setting: each chunk LMCache stores is retained in the
    sidecar (its Retain follows the put); without it nothing is."""
    eng = server.engine
    granted = eng.retention.granted
    _engine(driver, "plain", server.address)
    _store(driver, "plain", prompt=7, kv_seed=70)
    assert eng.retention.granted == granted
    _engine(driver, "ttl", server.address, settings={"cache_ttl_s": 300})
    _store(driver, "ttl", prompt=8, kv_seed=80)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and eng.retention.granted < granted + CHUNKS:
        time.sleep(0.05)
    assert eng.retention.granted == granted + CHUNKS
    now = eng.clock()
    ttls = sorted(round(eng.retention.deadline(k) - now) for k in eng.retention.retained_keys())
    assert len(ttls) == CHUNKS and all(295 <= t <= 300 for t in ttls)


def _leases_end(srv: Any) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(srv.engine.leases):
        time.sleep(0.02)
    return len(srv.engine.leases) == 0 and not srv.engine.leases.pins


def test_an_engine_with_a_local_cache_gets_copies_it_may_keep(server: Any,
                                                             driver: Driver) -> None:
    """LMCache files what it retrieves in its local CPU cache: those chunks must be
    its own memory, not a slot whose lease ends; later hits come from that cache."""
    _engine(driver, "a", server.address)
    _store(driver, "a", prompt=3, kv_seed=33)
    _engine(driver, "c", server.address, local_cpu=True)
    assert _retrieve(driver, "c", prompt=3, kv_seed=33)["hit_tokens"] == TOKENS
    link = driver.call("link", name="c")
    assert link["zero_copy"] is False and link["handed"] == {"held": 0, "copied": CHUNKS}
    assert _leases_end(server)
    # Again: every chunk from LMCache's own cache (the plugin hands over nothing more).
    assert _retrieve(driver, "c", prompt=3, kv_seed=33)["hit_tokens"] == TOKENS
    assert driver.call("link", name="c")["handed"] == {"held": 0, "copied": CHUNKS}
    # Without a local cache but zero_copy off: copies too.
    _engine(driver, "d", server.address, settings={"zero_copy": False})
    assert _retrieve(driver, "d", prompt=3, kv_seed=33)["hit_tokens"] == TOKENS
    link = driver.call("link", name="d")
    assert link["zero_copy"] is False and link["handed"] == {"held": 0, "copied": CHUNKS}


def test_a_corrupt_slot_fails_a_copying_retrieve_and_is_dropped(server_factory: Any,
                                                                driver: Driver) -> None:
    """The copying retrieve checks each chunk once, as it copies it: a flipped byte in
    the sidecar's slot is a miss (never wrong KV), and the plugin reports it, so the
    sidecar drops that copy."""
    from kvstore.connectors.lmcache.keys import block_hash_of

    # DRAM only: a disk tier's write-back may land an intact copy before the flip.
    server = server_factory(disk={"enabled": False})
    _engine(driver, "a", server.address)
    stored = _store(driver, "a", prompt=5, kv_seed=55)
    bad = block_hash_of(stored["chunk_hashes"][1])
    ns = next(e.key.namespace for e in server.engine.index.entries()
              if e.key.block_hash == bad)

    def flip(batch: Any) -> None:
        for _, slot in batch:
            slot.buffer[slot.offset + 1000] ^= 0xFF

    with KVStoreClient(server.address) as c:
        c.get_in_place(ns, [bad], flip, verify=False)  # unchecked: the sidecar keeps it
        assert c.lookup(ns, [bad]).num_hit == 1
    _engine(driver, "c", server.address, local_cpu=True)
    out = _retrieve(driver, "c", prompt=5, kv_seed=55)  # equal bytes over what it hit
    assert out["hit_tokens"] < TOKENS
    assert driver.call("link", name="c")["handed"]["held"] == 0
    assert _leases_end(server)
    with KVStoreClient(server.address, shared_memory=False) as c:
        assert c.lookup(ns, [bad]).num_hit == 0  # reported and dropped


def test_cache_salts_and_tenants_never_see_each_others_chunks(server: Any,
                                                              driver: Driver) -> None:
    # The same tokens under two salts, with different KV: each salt reads its own.
    _engine(driver, "alice", server.address)
    _engine(driver, "bob", server.address)
    _store(driver, "alice", prompt=1, kv_seed=11, salt="alice")
    _store(driver, "bob", prompt=1, kv_seed=22, salt="bob")
    with KVStoreClient(server.address, shared_memory=False) as c:
        st = c.stats()
    assert st.namespaces == 2 and st.blocks == 2 * CHUNKS

    _engine(driver, "reader", server.address)
    assert _retrieve(driver, "reader", 1, kv_seed=11, salt="alice")["hit_tokens"] == TOKENS
    assert _retrieve(driver, "reader", 1, kv_seed=22, salt="bob")["hit_tokens"] == TOKENS
    assert _retrieve(driver, "reader", 1, kv_seed=11, salt="carol")["hit_tokens"] == 0
    assert _retrieve(driver, "reader", 1, kv_seed=11)["hit_tokens"] == 0  # no salt

    # Another tenant (plugin setting) sees neither, even with the same salt.
    _engine(driver, "other", server.address, tenant="other")
    assert _retrieve(driver, "other", 1, kv_seed=11, salt="alice")["hit_tokens"] == 0


def _wait_written_back(address: str, blocks: int) -> None:
    deadline = time.monotonic() + 30
    with KVStoreClient(address, shared_memory=False) as c:
        while c.stats().tier("disk").blocks < blocks:
            assert time.monotonic() < deadline, "write-back to disk did not finish"
            time.sleep(0.1)


def _retrieve_until_hit(driver: Driver, name: str, prompt: int, kv_seed: int) -> dict[str, Any]:
    """After an outage the plugin asks again once ``retry_interval_s`` has passed."""
    deadline = time.monotonic() + 20
    while True:
        out = _retrieve(driver, name, prompt, kv_seed)
        if out["hit_tokens"] == TOKENS or time.monotonic() > deadline:
            return out
        time.sleep(0.3)


def test_sidecar_down_or_frozen_is_a_prompt_miss_and_hits_resume(server_process: Any,
                                                                 driver: Driver) -> None:
    timeout_s = 1.0
    sidecar = server_process()
    args = {"timeout_s": timeout_s, "retry_interval_s": 3.0}
    _engine(driver, "writer", sidecar.address, local_cpu=True, **args)
    _engine(driver, "reader", sidecar.address, **args)
    _store(driver, "writer", prompt=1, kv_seed=11)
    assert _retrieve(driver, "reader", 1, kv_seed=11)["hit_tokens"] == TOKENS
    _wait_written_back(sidecar.address, CHUNKS)  # so it survives the kill below

    # Down: connection refused. Misses at once; the engine goes on with its own cache.
    sidecar.kill9()
    out = _retrieve(driver, "reader", 1, kv_seed=11)
    assert out["hit_tokens"] == 0 and out["seconds"] < timeout_s + 2
    stored = _store(driver, "writer", prompt=2, kv_seed=12)
    writer_failed = time.monotonic()  # its link answers without asking for retry_interval_s
    assert stored["seconds"] < timeout_s + 2
    assert _retrieve(driver, "writer", 2, kv_seed=12)["hit_tokens"] == TOKENS  # local CPU
    assert driver.call("link", name="reader")["up"] is False

    # Back (same address, same data dir): hits resume, old chunks (from disk) and new.
    sidecar.start()
    assert _retrieve_until_hit(driver, "reader", 1, kv_seed=11)["hit_tokens"] == TOKENS
    # The writer's link failed after the reader's: its puts are skipped until its own
    # retry_interval_s has passed (a store before that is a miss by design).
    time.sleep(max(0.0, writer_failed + args["retry_interval_s"] + 0.2 - time.monotonic()))
    _store(driver, "writer", prompt=3, kv_seed=13)
    with KVStoreClient(sidecar.address, shared_memory=False) as c:
        held = c.stats().blocks
    assert held == 2 * CHUNKS, f"the sidecar holds {held} blocks: prompts 1 and 3 should be there"
    assert _retrieve(driver, "reader", 3, kv_seed=13)["hit_tokens"] == TOKENS
    link = driver.call("link", name="reader")
    assert link["up"] is True and link["reconnects"] >= 1

    # Frozen (SIGSTOP: the socket accepts, nothing answers): a miss after timeout_s.
    assert sidecar.proc is not None
    sidecar.proc.send_signal(signal.SIGSTOP)
    try:
        out = _retrieve(driver, "reader", 3, kv_seed=13)
        assert out["hit_tokens"] == 0 and out["seconds"] < timeout_s + 2
        out = _retrieve(driver, "reader", 3, kv_seed=13)  # breaker open: no wait at all
        assert out["hit_tokens"] == 0 and out["seconds"] < timeout_s
        stored = _store(driver, "writer", prompt=4, kv_seed=14)
        assert stored["seconds"] < 2 * timeout_s + 2
    finally:
        sidecar.proc.send_signal(signal.SIGCONT)
    assert _retrieve_until_hit(driver, "reader", 3, kv_seed=13)["hit_tokens"] == TOKENS
