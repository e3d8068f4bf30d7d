"""CURVE on the event sockets: an allowed client receives and replays; a subscriber
without a key, or with a key the server does not list, receives nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
import zmq.auth

from kvstore.errors import ConfigError
from kvstore.events import EventBus, EventsConfig, build_bus, wire
from kvstore.events.curve import curve_client
from kvstore.events.zmq_publisher import END_SEQ, ZmqPublisher
from kvstore.types import Medium

from .conftest import LOOPBACK_ANY, chain

TOPIC = b"kv@pod-a@tiny"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, str]:
    clients = tmp_path / "clients"
    clients.mkdir()
    _, server = zmq.auth.create_certificates(str(tmp_path), "server")
    _, client = zmq.auth.create_certificates(str(tmp_path), "client")
    (tmp_path / "client.key").rename(clients / "client.key")  # its public key: allowed
    _, stranger = zmq.auth.create_certificates(str(tmp_path), "stranger")
    return {"server_secret": server, "server_public": str(tmp_path / "server.key"),
            "clients": str(clients), "client": client, "stranger": stranger}


def _cfg(keys: dict[str, str]) -> EventsConfig:
    return EventsConfig(endpoint=LOOPBACK_ANY, replay_endpoint=LOOPBACK_ANY,
                        topic=TOPIC.decode(), curve_secret_key_file=keys["server_secret"],
                        curve_client_keys_dir=keys["clients"])


def _pub(bus: EventBus) -> ZmqPublisher:
    pub = bus._publishers[0]
    assert isinstance(pub, ZmqPublisher)
    return pub


async def _received(sock: zmq.asyncio.Socket, timeout: float) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while (left := end - loop.time()) > 0:
        if await sock.poll(int(left * 1000)):
            got.append(await sock.recv_multipart())
    return got


async def test_only_an_allowed_client_receives_events(keys: dict[str, str]) -> None:
    bus = build_bus(_cfg(keys))
    await bus.start()
    ctx = zmq.asyncio.Context()
    subs: dict[str, zmq.asyncio.Socket] = {}
    try:
        pub = _pub(bus)
        for name in ("client", "stranger", "plain"):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            if name != "plain":
                curve_client(sub, keys["server_public"], keys[name])
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub.endpoint)
            subs[name] = sub
        await asyncio.sleep(0.5)  # handshakes (and refusals) done
        for i in range(5):
            bus.block_stored(chain(list(range(i * 64, i * 64 + 64))), Medium.CPU)
            bus.flush()
        allowed = await _received(subs["client"], 2.0)
        assert len(allowed) == 5 and all(f[0] == TOPIC for f in allowed)
        assert isinstance(wire.decode_batch(allowed[0][2]).events[0], wire.BlockStored)
        assert await _received(subs["stranger"], 0.3) == []
        assert await _received(subs["plain"], 0.3) == []

        # replay: the allowed client is answered, a plain client is not
        for name in ("client", "plain"):
            req = ctx.socket(zmq.REQ)
            req.setsockopt(zmq.LINGER, 0)
            if name == "client":
                curve_client(req, keys["server_public"], keys["client"])
            req.connect(pub.replay_endpoint)
            await req.send((0).to_bytes(8, "big"))
            frames = await _received(req, 1.0)
            if name == "client":
                assert frames and frames[0][0] == TOPIC
            else:
                assert frames == []
            req.close(0)
    finally:
        for sub in subs.values():
            sub.close(0)
        ctx.term()
        await bus.close()


async def test_curve_replay_sends_every_batch_then_the_end(keys: dict[str, str]) -> None:
    bus = build_bus(_cfg(keys))
    await bus.start()
    ctx = zmq.asyncio.Context()
    try:
        for i in range(3):
            bus.block_stored(chain(list(range(i * 64, i * 64 + 64))), Medium.CPU)
            bus.flush()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        curve_client(dealer, keys["server_public"], keys["client"])
        dealer.connect(_pub(bus).replay_endpoint)
        await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        frames = [await asyncio.wait_for(dealer.recv_multipart(), 2) for _ in range(4)]
        assert [int.from_bytes(f[2], "big") for f in frames[:3]] == [0, 1, 2]
        assert frames[3] == [b"", b"", END_SEQ, b""]
        dealer.close(0)
    finally:
        ctx.term()
        await bus.close()


def test_curve_settings_are_checked(keys: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set both"):
        EventsConfig(curve_secret_key_file=keys["server_secret"])
    bad = EventsConfig(endpoint=LOOPBACK_ANY, replay_endpoint="",
                       curve_secret_key_file=keys["server_public"],  # public only
                       curve_client_keys_dir=keys["clients"])
    with pytest.raises(ConfigError, match="holds no secret key"):
        asyncio.run(build_bus(bad).start())
    missing = EventsConfig(endpoint=LOOPBACK_ANY, replay_endpoint="",
                           curve_secret_key_file=str(tmp_path / "nope"),
                           curve_client_keys_dir=keys["clients"])
    with pytest.raises(ConfigError, match="events.curve_secret_key_file: cannot read"):
        asyncio.run(build_bus(missing).start())


async def test_the_subscriber_with_keys_syncs_through_replay(keys: dict[str, str]) -> None:
    from kvstore.events.zmq_subscriber import ZmqSubscriber

    bus = build_bus(_cfg(keys))
    await bus.start()
    got: list[int] = []
    sub = ZmqSubscriber(_pub(bus).endpoint, lambda seq, batch: got.append(seq),
                        replay_endpoint=_pub(bus).replay_endpoint, topic=TOPIC.decode(),
                        start_seq=0, curve=(keys["server_public"], keys["client"]))
    try:
        for i in range(3):  # before the subscriber: only replay can deliver these
            bus.block_stored(chain(list(range(i * 64, i * 64 + 64))), Medium.CPU)
            bus.flush()
        await sub.start()
        await asyncio.wait_for(sub.synced.wait(), 5)
        await asyncio.sleep(0.3)
        bus.block_stored(chain(list(range(1000, 1064))), Medium.CPU)
        bus.flush()
        for _ in range(200):
            if len(got) == 4:
                break
            await asyncio.sleep(0.01)
        assert got == [0, 1, 2, 3]
    finally:
        await sub.close()
        await bus.close()
