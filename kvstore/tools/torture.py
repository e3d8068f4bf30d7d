"""Crash torture: ``kill -9`` a real ``kvstore serve`` under write load, restart, verify.

    kvstore torture [--iterations 50] [--writers 2] [--policy lru]
                                        [--dir DIR]

Each iteration: writers put chained blocks (random sizes, random bytes) into a
running server over the shared-memory plane; a subscriber records every block
the server reported durable (a ``BlockStored`` event with medium ``DISK``: the
engine publishes it once the disk tier's put returned, which is after the
record's ``fdatasync``); the server gets ``SIGKILL`` at a random moment or,
in ``commit`` iterations, the moment one of its threads is inside the disk
tier's commit (``pwrite``/``fdatasync`` seen in ``/proc/<pid>/task/*/syscall``).
Then, before anything else touches the data dir, the disk tier's files are
read offline (read-only), and the server restarts on the same dir and serves:

* **acknowledged**: blocks puts stored; **durable**: blocks reported on disk;
* **corrupt**: a block whose bytes (on disk, or served after the restart) differ
  from what was put under its hash;
* **phantom**: a block on disk that no writer ever sent;
* **lost**: a block reported durable that is not on disk, not reachable there (an
  ancestor missing: the engine drops such an orphan at restart), or not served.

The promise is 0 corrupt, 0 phantom, 0 lost, every block reported durable counted.
Every block reported durable in any iteration stays expected in all later ones (the
disk tier is sized so that nothing is evicted from it), so restarts also re-verify
older segments. ``--policy``: the engine's policy (``lru``, the default here, writes
every block back at once, so a kill often lands inside a commit; ``adaptive``, the
server's default, and ``workload`` write back what they value at once and the rest at
the recovery point, ``disk.max_write_delay_s``).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from kvstore.hashing import block_hash_to_int
from kvstore.tools.harness import LocalServer

__all__ = ["Torture", "TortureResult", "in_commit", "main"]

NAMESPACE = "torture"
#: Syscalls of the disk tier's commit path, per architecture.
_COMMIT_SYSCALLS = {
    "x86_64": {18: "pwrite64", 296: "pwritev", 74: "fsync", 75: "fdatasync"},
    "aarch64": {68: "pwrite64", 70: "pwritev", 82: "fsync", 83: "fdatasync"},
}


def in_commit(pid: int) -> str | None:
    """Name of the commit syscall a thread of ``pid`` is inside now, if any."""
    table = _COMMIT_SYSCALLS.get(platform.machine(), {})
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/syscall") as f:
                first = f.read().split(" ", 1)[0]
        except OSError:
            continue
        if first.isdigit() and int(first) in table:
            return table[int(first)]
    return None


def commit_probe_works() -> bool:
    """Whether this host lets us see a child's syscalls (needed for commit kills)."""
    if platform.machine() not in _COMMIT_SYSCALLS:
        return False
    try:
        with open(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/syscall") as f:
            return bool(f.read().strip())
    except OSError:
        return False


@dataclass
class TortureResult:
    iterations: int = 0
    acknowledged: int = 0
    durable: int = 0  # distinct blocks reported on disk, over the whole run
    corrupt: int = 0
    phantom: int = 0
    lost: int = 0
    unreported_on_disk: int = 0  # intact on disk, not (yet) reported durable at the kill
    #: of ``lost``: reported durable and intact on disk, but an ancestor is not there
    durable_orphans: int = 0
    dropped_at_restart: int = 0  # half-written regions / damaged records skipped
    commit_kills: list[str] = field(default_factory=list)  # syscall seen at each commit kill
    verified_reads: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.iterations} iterations: acknowledged {self.acknowledged}, durable "
                f"{self.durable}, corrupt {self.corrupt}, phantom {self.phantom}, lost "
                f"{self.lost} (of which orphans: intact on disk, an ancestor missing "
                f"{self.durable_orphans}); on disk but not reported durable "
                f"{self.unreported_on_disk}, "
                f"half-written regions dropped {self.dropped_at_restart}, kills inside a "
                f"commit {len(self.commit_kills)} ({', '.join(sorted(set(self.commit_kills)))})"
                f", {self.verified_reads} blocks read back, {self.seconds:.0f}s")


class Torture:
    """The loop; ``run_iteration`` can be driven one step at a time (tests)."""

    def __init__(self, base: Path, *, writers: int = 2, seed: int = 0,
                 min_kib: int = 16, max_kib: int = 128, mb_per_s: float = 24.0,
                 policy: str = "lru", log: Callable[[str], None] = print):
        self.base = base
        self.data_dir = base / "data"
        self.rng = random.Random(seed)
        self.writers = writers
        self.sizes = (min_kib << 10, max_kib << 10)
        self.pace = mb_per_s * 1e6
        self.log = log
        self.sent: dict[bytes, int] = {}  # hash -> xxh3-64 of the payload put under it
        self.by_int: dict[int, bytes] = {}  # low 64 bits as events carry them -> hash
        self.durable: set[bytes] = set()  # reported on disk, over the whole run
        self.expected: set[bytes] = set()  # must be on disk: reported, or found there before
        self.removed: list[bytes] = []  # blocks that left the disk tier (must stay empty)
        self._on_disk: dict[bytes, int] = {}
        self.result = TortureResult()
        # lru: every block goes through DRAM and is written back to disk at once, so the
        # disk tier commits all the time and a kill lands inside a commit.
        self.policy = policy
        env = {"KVSTORE_DRAM__CAPACITY": "32MiB", "KVSTORE_DISK__CAPACITY": "16GiB",
               "KVSTORE_ENGINE__POLICY": policy}
        self.server = LocalServer(self.data_dir, env=env,
                                  log_path=base / "torture-server.log")
        self._lock = threading.Lock()

    # ---- one iteration ------------------------------------------------------------
    def run_iteration(self, commit_kill: bool) -> None:
        t0 = time.monotonic()
        if self.server.proc is None or self.server.proc.poll() is not None:
            self.server.start()
        stop = threading.Event()
        reported: set[bytes] = set()
        sub = threading.Thread(target=self._subscribe, args=(stop, reported), daemon=True)
        sub.start()
        self._wait_subscribed(reported)
        acked: list[int] = [0]
        threads = [threading.Thread(target=self._write, args=(stop, acked, i), daemon=True)
                   for i in range(self.writers)]
        for t in threads:
            t.start()
        seen = self._kill(commit_kill)
        stop.set()
        for t in threads:
            t.join(30)
        sub.join(30)
        if self.removed:
            raise RuntimeError(f"{len(self.removed)} blocks left the disk tier: the torture "
                               "sizes it so that none does (durability could not be judged)")
        reported.discard(b"subscribed")
        self.durable |= reported
        self.expected |= reported
        self.result.acknowledged += acked[0]
        self._check_offline()
        self.server.start()
        self._check_served(reported)
        self.result.iterations += 1
        self.result.durable = len(self.durable)
        if seen:
            self.result.commit_kills.append(seen)
        self.result.seconds += time.monotonic() - t0

    def _kill(self, commit_kill: bool) -> str | None:
        pid = self.server.pid
        time.sleep(self.rng.uniform(0.3, 1.2))
        seen = None
        if commit_kill:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and seen is None:
                seen = in_commit(pid)
        self.server.kill9()
        return seen

    # ---- load and events ----------------------------------------------------------
    def _write(self, stop: threading.Event, acked: list[int], wid: int) -> None:
        from kvstore import BlockData, KVStoreClient

        rng = np.random.default_rng(self.rng.getrandbits(32))
        parent: bytes | None = None
        try:
            with KVStoreClient(self.server.address, timeout=10.0) as c:
                while not stop.is_set():
                    t0 = time.monotonic()
                    blocks = []
                    for _ in range(4):
                        size = int(rng.integers(*self.sizes))
                        payload = rng.bytes(size)
                        h = rng.bytes(32)
                        with self._lock:
                            self.sent[h] = xxhash.xxh3_64_intdigest(payload)
                            self.by_int[block_hash_to_int(h)] = h
                        tokens = rng.integers(0, 32000, 16).tolist()
                        blocks.append(BlockData(h, parent, tokens, payload))
                        parent = h
                    stored = c.put(NAMESPACE, blocks, session_id=f"w{wid}")
                    with self._lock:
                        acked[0] += stored
                    nbytes = sum(len(b.payload) for b in blocks)
                    time.sleep(max(0.0, nbytes / self.pace - (time.monotonic() - t0)))
        except Exception:  # the server was killed under us
            return

    def _subscribe(self, stop: threading.Event, reported: set[bytes]) -> None:
        import grpc

        from kvstore._proto.kvstore.v1 import kvstore_pb2 as pb
        from kvstore._proto.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
        from kvstore.events import wire

        try:
            with grpc.insecure_channel(self.server.address) as ch:
                call = pb_grpc.KVStoreStub(ch).SubscribeEvents(pb.SubscribeRequest(start_seq=-1))
                for msg in call:
                    for ev in wire.decode_batch(msg.payload).events:
                        self._apply(ev, reported)
                    if stop.is_set():
                        call.cancel()
        except Exception:  # the stream ends with the server
            return

    def _apply(self, ev: object, reported: set[bytes]) -> None:
        from kvstore.events import wire
        from kvstore.events.media import tier_medium

        medium = tier_medium(getattr(ev, "medium", None), getattr(ev, "locality", None))
        with self._lock:
            hashes = [self.by_int.get(h if isinstance(h, int) else block_hash_to_int(h))
                      for h in getattr(ev, "block_hashes", ())]
            known = [h for h in hashes if h is not None]
            if isinstance(ev, wire.BlockStored):
                reported.add(b"subscribed")
                if medium == "disk":
                    reported.update(known)
            elif isinstance(ev, wire.BlockRemoved) and medium == "disk":
                self.removed.extend(known)

    def _wait_subscribed(self, reported: set[bytes]) -> None:
        from kvstore import BlockData, KVStoreClient

        with KVStoreClient(self.server.address, timeout=10.0, shared_memory=False) as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                probe, payload = os.urandom(32), os.urandom(4096)
                with self._lock:
                    self.sent[probe] = xxhash.xxh3_64_intdigest(payload)
                    self.by_int[block_hash_to_int(probe)] = probe
                c.put(NAMESPACE, [BlockData(probe, None, list(range(16)), payload)])
                time.sleep(0.05)
                with self._lock:
                    if b"subscribed" in reported:
                        reported.discard(b"subscribed")
                        return
        raise TimeoutError("the event subscription did not start")

    # ---- verification -------------------------------------------------------------
    def _check_offline(self) -> None:
        """Read the disk tier's files as a restart will (read-only), before it does."""
        from kvstore.tiers.disk.recover import live_records, recover_root

        report = recover_root(self.data_dir / "disk", direct=False, sync=False, readonly=True)
        try:
            live = live_records(report)
        finally:
            for seg in report.segments:
                os.close(seg.file.fd)
        self.result.dropped_at_restart += report.torn + report.damaged
        on_disk = {h: e.checksum for (ns, h), e in live.items() if ns == NAMESPACE}
        parents = {h: e.parent for (ns, h), e in live.items() if ns == NAMESPACE}
        reachable = _reachable(parents)
        with self._lock:
            sent = dict(self.sent)
        phantom = [h for h in on_disk if h not in sent]
        corrupt = [h for h, c in on_disk.items() if h in sent and sent[h] != c]
        missing = [h for h in self.expected if h not in on_disk]
        orphans = [h for h in self.expected if h in on_disk and h not in reachable]
        self.result.phantom += len(phantom)
        self.result.corrupt += len(corrupt)
        self.result.lost += len(missing) + len(orphans)
        self.result.durable_orphans += len(orphans)
        self.result.unreported_on_disk += len(set(on_disk) - self.expected)
        # The restart serves what a prefix can reach; those blocks must stay from now on
        # (a lost one is counted once, here; unreported orphans were never promised).
        self.expected = (self.expected | set(on_disk)) & reachable
        if phantom or corrupt or missing or orphans:
            self.log(f"iteration {self.result.iterations}: on disk {len(on_disk)}, phantom "
                     f"{len(phantom)}, corrupt {len(corrupt)}, lost {len(missing)} missing "
                     f"+ {len(orphans)} orphaned")
        self._on_disk = {h: on_disk[h] for h in reachable}

    def _check_served(self, reported: set[bytes]) -> None:
        """After the restart: the server holds exactly what is on disk, and serves the
        blocks reported durable in this iteration (and a sample of older ones) intact."""
        from kvstore import KVStoreClient

        with KVStoreClient(self.server.address, timeout=60.0) as c:
            st = c.stats()
            disk = st.tier("disk").blocks
            if disk != len(self._on_disk):
                self.log(f"iteration {self.result.iterations}: server holds {disk} disk blocks, "
                         f"{len(self._on_disk)} intact and reachable on disk")
                self.result.lost += max(len(self._on_disk) - disk, 0)
                self.result.phantom += max(disk - len(self._on_disk), 0)
            older = sorted(self.expected - reported)
            check = sorted(reported & self.expected) + self.rng.sample(older, min(len(older), 200))
            for i in range(0, len(check), 64):
                chunk = check[i : i + 64]
                got = c.get(NAMESPACE, chunk)
                for h, g in zip(chunk, got, strict=True):
                    if g is None:
                        self.result.lost += 1
                    elif xxhash.xxh3_64_intdigest(g.payload) != self.sent[h]:
                        self.result.corrupt += 1
                    else:
                        self.result.verified_reads += 1

    def close(self) -> None:
        self.server.stop()


def _reachable(parents: dict[bytes, bytes | None]) -> set[bytes]:
    """Blocks whose every ancestor is present (the engine's rule at restart)."""
    ok: dict[bytes, bool] = {}
    for start in parents:
        path: list[bytes] = []
        cur: bytes | None = start
        good = True
        while cur is not None and cur not in ok:
            if cur not in parents or cur in path:
                good = False
                break
            path.append(cur)
            cur = parents[cur]
        if cur is not None and cur in ok:
            good = ok[cur]
        for h in path:
            ok[h] = good
    return {h for h, good in ok.items() if good}


def run(iterations: int, base: Path, *, commit_every: int = 2, writers: int = 2, seed: int = 0,
        policy: str = "lru", log: Callable[[str], None] = print) -> TortureResult:
    """``iterations`` kill/restart cycles; every ``commit_every``-th kill waits for a
    commit (when this host shows syscalls), the others land at random."""
    t = Torture(base, writers=writers, seed=seed, policy=policy, log=log)
    probe = commit_probe_works()
    try:
        for i in range(iterations):
            t.run_iteration(commit_kill=probe and commit_every > 0 and i % commit_every == 1)
            log(f"[{i + 1}/{iterations}] {t.result.line()}")
    finally:
        t.close()
    return t.result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvstore torture", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="lru",
                   help="engine policy (lru: write-back at once; adaptive: the server's default)")
    p.add_argument("--dir", type=Path, default=None, help="where the data dir goes")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="kvtorture-") as tmp:
        res = run(args.iterations, Path(tmp), writers=args.writers, seed=args.seed,
                  policy=args.policy)
    print(res.line())
    sys.exit(0 if res.corrupt == res.phantom == res.lost == 0 else 1)


if __name__ == "__main__":
    main()
