"""Whether an HBM keep pays, measured online per class of wait.

A keep (``Plan.keep_s``) asks the serving engine to hold a finished request's
blocks for a while, so that the session's next request finds them in the
engine's own cache. It pins engine memory that the other requests lose, so it
is worth asking only where it wins something the sidecar would not win anyway:
the session must be back within the keep, and the blocks it finds held must be
ones the sidecar would not have served as fast (missing there, or only in a tier
whose load costs a good share of recomputing). A block the sidecar serves from
DRAM costs a load of ~2% of its prefill: holding it gains almost nothing.

Whether a keep *would* have paid needs no keep: when the session comes back, the
lookup shows when (the gap) and what the sidecar serves of the prefix the keep
would have held. So every wait a keep was considered for is judged, held or
not, and the ledger keeps per class (workload, what the session waits on, the
tool) the decayed mean *gain*: the share of the held prefix the keep would have
served that the sidecar would not (0 for a return after the keep or a prefix
that changed). A class whose keeps win less than ``bar`` of what they pin asks
for none. Nothing here sees the future: a wait is judged when it ends.

Where the lookup says what the engine's own cache held (``RequestInfo.engine_hit``,
vLLM's ``num_computed_tokens``), a block the engine kept by itself counts no gain:
a keep that was not asked shows what the engine keeps unheld, so its return is
judged past that. A keep that was asked hides it (the held prefix is an engine hit
either way), so its return is not judged; instead one in ``probe`` of the keeps a
class would ask is left unasked, so that the class's ledger keeps learning.
Without the engine's hit (an older client) every return is judged as before,
the engine's own cache unseen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["HoldLedger", "PendingHold"]


@dataclass(frozen=True, slots=True)
class PendingHold:
    """A keep considered for a session's last request, judged at its next one."""

    cls: Hashable
    #: The keep it would have had (seconds) and the full blocks it would have held.
    keep_s: float
    blocks: int
    #: The key of the last of those blocks (chained hashes: a match is the prefix).
    last: Hashable
    #: Whether the keep was asked (the engine held the blocks, if it had the room).
    asked: bool = False


class HoldLedger:
    """Per class, the decayed mean gain of the keeps considered; the keeps whose wait
    is running, to judge those whose session is not back by the keep's end.

    ``weights``: per tier, the share of a block's prefill a keep gains over a load
    from that tier (1 - the cost model's saving / the prefill; a tier that is not
    named, or a block the sidecar lacks, counts 1)."""

    __slots__ = ("_asks", "_ends", "_mean", "_n", "bar", "decay", "max_running",
                 "min_waits", "probe", "weights")

    def __init__(self, weights: Mapping[str, float], bar: float = 0.5, min_waits: int = 8,
                 decay: float = 0.98, max_running: int = 200_000, probe: int = 4) -> None:
        if not 0.0 <= bar <= 1.0 or min_waits < 1 or not 0.0 < decay <= 1.0 or probe < 2:
            raise ValueError(f"hold ledger: bar {bar} in [0, 1], min_waits {min_waits} >= 1, "
                             f"decay {decay} in (0, 1], probe {probe} >= 2")
        self.weights = dict(weights)
        self.bar = bar
        self.min_waits = min_waits
        self.decay = decay
        self.max_running = max_running
        self.probe = probe
        #: per class, the keeps it would have asked (every ``probe``-th is not)
        self._asks: dict[Hashable, int] = {}
        self._mean: dict[Hashable, float] = {}
        self._n: dict[Hashable, int] = {}
        #: (end of the keep, session, the keep), in the order their waits began
        self._ends: deque[tuple[float, Hashable, PendingHold]] = deque()

    # -- what a keep gains ------------------------------------------------------------
    def gain_over(self, tiers: Sequence[str | None], n: int, engine: int = 0) -> float:
        """Share of ``n`` held blocks' prefill a keep gains over the sidecar serving
        the prefix ``tiers`` says it has (each block past that prefix: all of it),
        the first ``engine`` blocks (the engine kept them itself) gaining nothing."""
        w = self.weights
        gained = 0.0
        j = 0
        for t in tiers[:n]:
            if t is None or t not in w:
                break
            if j >= engine:
                gained += w[t]
            j += 1
        return (gained + n - max(j, min(engine, n))) / n

    def returned(self, hold: PendingHold, keys: Sequence[Hashable],
                 tiers: Sequence[str | None], waited_s: float,
                 engine_hit: int | None = None) -> None:
        """The session is back after ``waited_s`` asking for ``keys``, of which the
        sidecar serves the prefix ``tiers`` (fastest tier worth loading, or None)
        and the engine's own cache the first ``engine_hit`` (None: unknown): the
        keep gained only if it was still held, for the prefix it held, and only
        what the engine did not keep by itself and the sidecar would not have
        served nearly as fast. An asked keep's return, with the engine's hit known,
        is not judged (the hit is the keep's own)."""
        n = hold.blocks
        if waited_s > hold.keep_s or len(keys) < n or keys[n - 1] != hold.last:
            self.judge(hold.cls, 0.0)
        elif engine_hit is None:
            self.judge(hold.cls, self.gain_over(tiers, n))
        elif not hold.asked:
            self.judge(hold.cls, self.gain_over(tiers, n, engine_hit))

    def ask(self, cls: Hashable) -> bool:
        """A keep of ``cls`` would be asked: whether to ask it (every ``probe``-th is
        left unasked, to see what the engine keeps without it)."""
        n = self._asks.get(cls, 0) + 1
        self._asks[cls] = n
        return n % self.probe != 0

    def watch(self, name: Hashable, hold: PendingHold, now: float) -> None:
        """``hold``'s wait starts now (:meth:`expired` hands it back after its end)."""
        self._ends.append((now + hold.keep_s, name, hold))
        if len(self._ends) > self.max_running:
            self._ends.popleft()  # bounded: its session's return judges it

    def expired(self, now: float) -> Iterator[tuple[Hashable, PendingHold]]:
        """The watched keeps that ended before ``now`` (the caller judges those whose
        session is not back: a session that never comes back counts, its keep pinned
        the engine's memory for nothing)."""
        ends = self._ends
        while ends and ends[0][0] < now:
            _, name, hold = ends.popleft()
            yield name, hold

    # -- the ledger ---------------------------------------------------------------------
    def judge(self, cls: Hashable, gain: float) -> None:
        """A wait of ``cls`` ended: a keep would have gained ``gain`` (0 to 1) of
        what it held."""
        n = self._n.get(cls, 0)
        m = self._mean.get(cls, 0.0)
        # A plain mean until 1 / (1 - decay) waits, then decayed (recent ones count more).
        w = max(1.0 - self.decay, 1.0 / (n + 1))
        self._mean[cls] = m + w * (gain - m)
        self._n[cls] = n + 1

    def judged(self, cls: Hashable) -> int:
        return self._n.get(cls, 0)

    def gain(self, cls: Hashable) -> float | None:
        """The class's mean gain, or None before ``min_waits`` of its waits ended."""
        if self._n.get(cls, 0) < self.min_waits:
            return None
        return self._mean[cls]

    def pays(self, cls: Hashable) -> bool | None:
        """Whether keeps of ``cls`` pay (None: not learned yet)."""
        g = self.gain(cls)
        return None if g is None else g >= self.bar
