"""What the load test reads and writes: overlapping chains of blocks whose bytes
any reader can re-derive from the block hash alone.

A *family* is a shared prefix (a system prompt, a tool schema) of
``prefix_blocks`` blocks; each *chain* (a conversation) continues one family's
prefix with ``chain_blocks`` blocks of its own, so chains of one family share
their first blocks and writers of different chains store the same blocks
concurrently. Block hashes are chained (each digests its parent's hash), 32
bytes, like vLLM's sha256 hashes. A block's size is picked from the block sizes
by its hash, and its payload is a 4 KiB pattern derived from the hash, repeated:
two different blocks differ in every 4 KiB page, so a read that returns another
block's bytes (even in part) never compares equal.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["OPS", "Chain", "LoadSpec", "Workload", "expected_payload", "payload_size",
           "parse_mix", "token_ids"]

#: Operations of the mix, with their default weights.
OPS: Mapping[str, float] = {
    "put_shm": 2.0,      # put through shared memory (Reserve / write / Commit)
    "put_grpc": 1.0,     # put streamed over gRPC
    "lookup": 3.0,       # longest stored prefix
    "get_shm": 3.0,      # get under a read lease (shared memory)
    "get_grpc": 1.0,     # get streamed over gRPC
    "get_into": 2.0,     # get into caller-owned buffers (shared memory)
    "delete": 0.2,       # delete a chain's own tail (frees slots under readers)
}

_PATTERN = 4096
TOKENS_PER_BLOCK = 16


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One load run. Sizes in bytes."""

    clients: int = 64
    seconds: float = 60.0
    block_sizes: tuple[int, ...] = (16 * 2**10, 64 * 2**10, 256 * 2**10)
    families: int = 8
    prefix_blocks: int = 4
    chains: int = 256
    chain_blocks: int = 16
    namespaces: int = 2
    #: Share of operations that go to the hottest tenth of the chains.
    hot_share: float = 0.5
    mix: Mapping[str, float] = field(default_factory=lambda: dict(OPS))
    processes: int = 1
    seed: int = 0
    #: Per-call client timeout (s): a call slower than this is an unexpected error.
    timeout: float = 60.0

    def validate(self) -> None:
        if self.clients < 1 or self.processes < 1 or self.processes > self.clients:
            raise ValueError("need clients >= processes >= 1")
        if self.seconds <= 0 or not self.block_sizes or min(self.block_sizes) <= 0:
            raise ValueError("seconds and block sizes must be > 0")
        if self.families < 1 or self.chains < 1 or self.chain_blocks < 1 or self.namespaces < 1:
            raise ValueError("families, chains, chain_blocks and namespaces must be >= 1")
        unknown = set(self.mix) - set(OPS)
        if unknown or not any(w > 0 for w in self.mix.values()):
            raise ValueError(f"mix: unknown {sorted(unknown)} or no positive weight; "
                             f"operations: {', '.join(OPS)}")


def parse_mix(text: str) -> dict[str, float]:
    """``"put_shm=2,lookup=3"`` -> weights (operations not named keep weight 0)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, weight = part.partition("=")
        if not sep or name not in OPS:
            raise ValueError(f"--mix: expected OP=WEIGHT with OP in {', '.join(OPS)}, "
                             f"got {part!r}")
        out[name] = float(weight)
    return out


def payload_size(block_hash: bytes, sizes: Sequence[int]) -> int:
    return sizes[block_hash[0] % len(sizes)]


def expected_payload(block_hash: bytes, size: int) -> bytes:
    """The bytes every writer stores under ``block_hash`` (and every reader expects)."""
    pattern = hashlib.shake_256(block_hash).digest(_PATTERN)
    whole, rest = divmod(size, _PATTERN)
    return pattern * whole + pattern[:rest]


def token_ids(block_hash: bytes) -> tuple[int, ...]:
    return tuple(int.from_bytes(block_hash[i:i + 2], "little") for i in range(0, 32, 2))


@dataclass(frozen=True, slots=True)
class Chain:
    namespace: str
    hashes: tuple[bytes, ...]
    #: How many leading blocks are the family's shared prefix.
    shared: int

    def parent(self, i: int) -> bytes | None:
        return self.hashes[i - 1] if i else None


def _digest(parent: bytes, label: str) -> bytes:
    return hashlib.sha256(parent + label.encode()).digest()


class Workload:
    """The chains of one run (deterministic for a seed) and the draw of operations."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.chains: list[Chain] = []
        for c in range(spec.chains):
            ns = f"loadtest-{spec.seed}-{c % spec.namespaces}"
            fam = (c // spec.namespaces) % spec.families
            hashes: list[bytes] = []
            parent = ns.encode()
            for i in range(spec.prefix_blocks):
                parent = _digest(parent, f"family-{fam}-{i}")
                hashes.append(parent)
            for i in range(spec.chain_blocks):
                parent = _digest(parent, f"chain-{c}-{i}")
                hashes.append(parent)
            self.chains.append(Chain(ns, tuple(hashes), spec.prefix_blocks))
        self._ops = [op for op, w in spec.mix.items() if w > 0]
        self._weights = [spec.mix[op] for op in self._ops]
        self._hot = max(1, spec.chains // 10)

    def draw(self, rng: random.Random) -> tuple[str, Chain, int]:
        """(operation, chain, number of leading blocks it touches)."""
        op = rng.choices(self._ops, self._weights)[0]
        if rng.random() < self.spec.hot_share:
            chain = self.chains[rng.randrange(self._hot)]
        else:
            chain = self.chains[rng.randrange(len(self.chains))]
        return op, chain, rng.randint(1, len(chain.hashes))

    def size(self, block_hash: bytes) -> int:
        return payload_size(block_hash, self.spec.block_sizes)

    def max_bytes(self) -> int:
        """Largest payload one operation can touch (for get_into buffers)."""
        return max(self.spec.block_sizes) * (self.spec.prefix_blocks + self.spec.chain_blocks)
