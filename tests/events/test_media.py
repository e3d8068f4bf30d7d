"""Both media vocabularies (``events.media``): what the bus publishes in each, the
session a stored run carries, and a router scoring either the same way."""

from __future__ import annotations

import pytest
from kvstore.connectors.router import PrefixIndex, PrefixScorer

from kvstore.errors import ConfigError
from kvstore.events import EventBus, EventsConfig, MemoryPublisher, wire
from kvstore.events.media import tier_medium
from kvstore.hashing import block_hash_to_int
from kvstore.types import BlockMeta, Medium

from .conftest import chain

STORAGE_MEDIA = {Medium.CPU: ("CPU", "LOCAL", "dram"), Medium.DISK: ("STORAGE", "LOCAL", "disk"),
                 Medium.REMOTE: ("STORAGE", "REMOTE", "redis")}
TIERS_MEDIA = {Medium.CPU: ("CPU", None, None), Medium.DISK: ("DISK", None, None),
               Medium.REMOTE: ("REMOTE", None, None)}


def _published(media: str, encoding: str = "map") -> list[wire.KVCacheEvent]:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(media=media, encoding=encoding), [mem])  # type: ignore[arg-type]
    metas = chain(list(range(96)), 32)
    for i, medium in enumerate((Medium.CPU, Medium.DISK, Medium.REMOTE)):
        bus.block_stored(metas[i:i + 1], medium)
        bus.block_removed([metas[i].key], medium)
    bus.flush()
    return list(wire.decode_batch(mem.batches[0].payload).events)


@pytest.mark.parametrize("encoding", wire.ENCODINGS)
@pytest.mark.parametrize(("media", "want"), [("storage", STORAGE_MEDIA), ("tiers", TIERS_MEDIA)])
def test_each_vocabulary_names_the_tiers(media: str, want: dict[Medium, tuple[str, ...]],
                                         encoding: str) -> None:
    events = _published(media, encoding)
    expected = [want[m] for m in (Medium.CPU, Medium.DISK, Medium.REMOTE) for _ in range(2)]
    assert [(e.medium, e.locality, e.ownership) for e in events] == expected  # type: ignore[union-attr]
    kinds = [isinstance(e, wire.BlockStored) for e in events]
    assert kinds == [True, False] * 3


def test_storage_is_the_default() -> None:
    assert EventsConfig().media == "storage"
    with pytest.raises(ConfigError, match=r"events\.media must be one of storage, tiers"):
        EventsConfig(media="STORAGE")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"events\.media"):
        EventsConfig.from_mapping({"media": 3})


def test_a_stored_run_carries_its_session_and_splits_where_it_changes() -> None:
    mem = MemoryPublisher()
    bus = EventBus(EventsConfig(), [mem])
    metas = chain(list(range(128)), 32)
    with_session = [BlockMeta(m.key, m.parent_hash, m.token_ids, m.size, 0,
                              session_id="s1" if i < 3 else "s2") for i, m in enumerate(metas)]
    bus.block_stored(with_session, Medium.CPU)
    bus.block_stored(chain(list(range(500, 532)), 32), Medium.CPU)  # no session
    bus.flush()
    events = wire.decode_batch(mem.batches[0].payload).events
    assert [(len(e.block_hashes), e.session_id) for e in events] == [  # type: ignore[union-attr]
        (3, "s1"), (1, "s2"), (1, None)]
    assert all(e.lookahead_token_ids is None for e in events)  # type: ignore[union-attr]


def test_lookahead_token_ids_round_trip_in_both_encodings() -> None:
    for encoding in wire.ENCODINGS:
        ev = wire.to_encoding(wire.stored([1], None, [5] * 16, 16, "GPU"), encoding)  # type: ignore[arg-type]
        ev.lookahead_token_ids = [7, 8]  # type: ignore[attr-defined]
        got = wire.decode_batch(wire.encode_batch(1.0, [ev])).events[0]
        assert isinstance(got, wire.BlockStored) and got.lookahead_token_ids == [7, 8]


def test_tier_medium_reads_both_vocabularies() -> None:
    assert tier_medium("STORAGE", "LOCAL") == tier_medium("DISK") == "disk"
    assert tier_medium("STORAGE", "REMOTE") == tier_medium("REMOTE") == "remote"
    assert tier_medium("STORAGE") == "disk"  # unspecified locality: local storage
    assert tier_medium(None) == "gpu" and tier_medium("CPU", "LOCAL") == "cpu"


@pytest.mark.parametrize("media", ["storage", "tiers"])
def test_the_router_scores_either_vocabulary_as_disk_and_remote(media: str) -> None:
    index = PrefixIndex()
    events = _published(media)
    disk_pod = [e for e in events if isinstance(e, wire.BlockStored)
                and tier_medium(e.medium, e.locality) == "disk"]
    remote_pod = [e for e in events if isinstance(e, wire.BlockStored)
                  and tier_medium(e.medium, e.locality) == "remote"]
    index.apply("disk-pod", disk_pod)
    index.apply("remote-pod", remote_pod)
    h_disk, h_remote = disk_pod[0].block_hashes, remote_pod[0].block_hashes
    scorer = PrefixScorer(index)
    assert scorer.score(h_disk) == pytest.approx({"disk-pod": 0.5})
    assert scorer.score(h_remote) == pytest.approx({"remote-pod": 0.3})
    index.apply("disk-pod", [e for e in events if isinstance(e, wire.BlockRemoved)])
    assert index.blocks("disk-pod") == set()
    assert h_disk == [block_hash_to_int(chain(list(range(96)), 32)[1].key.block_hash)]


def test_the_events_tail_shows_locality_ownership_and_session() -> None:
    from kvstore.tools.events_tail import format_event

    ev = wire.stored([1], None, [0] * 16, 16, "STORAGE", locality="REMOTE", ownership="redis",
                     session_id="s1")
    line = format_event(3, 1.0, ev)
    assert "medium=STORAGE" in line and "locality=REMOTE ownership=redis session_id=s1" in line
    assert "locality" not in format_event(4, 1.0, wire.removed([1], "DISK"))
