"""The adaptive policy's guard: its bets scored, paired, against a ghost of LRU.

Part of :class:`~kvstore.policies.adaptive.AdaptivePolicy` (its score half): the
score, the allowance, the probations and the trials that decide which expert leads.

How the bets are scored: a ghost of LRU
(:class:`~kvstore.policies.lru_ghost.LRUGhost`: keys only, bounded by the tier's
capacity, no bytes) replays every lookup as LRU would (a request's prefix hits up to
its first miss, then every key touched, last block first). It is the ghost of
"what LRU would have kept and evicted", and exact for LRU, so the policy is scored
paired against it: each request, whoever leads, adds its real prefix hits minus the
ghost's to a *score*: the trace's hits so far minus LRU's, but never above a *bank*
of ``bank`` capacities of hits (old wins pay for at most that much of new losses).
The score falls when the bets refuse or drop blocks that LRU would have hit (and
after a hand-over, while the tiers still lack what the bets left out), and rises
when their keeps hit what LRU had evicted.

The bets lead while the score stays above ``-allowance``, what the trace may lose
to LRU: ``allowance_per_root`` times the square root of the sum of the squared
per-request differences so far (at least ``min_allowance`` blocks): the chance swing
of the paired difference, which grows as the square root of the evidence, so a share
of the lookups that shrinks as the trace goes on (and scales with how many blocks one
request can win or lose: a block on a short chat trace, hundreds on an agent's).
Below it *lru* takes over for a probation of ``backoff`` windows of
``window`` capacities of looked-up blocks, and ``backoff`` doubles (up to
``max_backoff``); a trial that holds as long as its probation halves it again. An
absolute slack (capacities of hits, decayed over a window) could not see a steady
loss: a short trace, a small tier or a loss under slack/window per lookup never
crossed it (issue 24: on generated traces whose requests name no session, 1-5
points below LRU).

After a probation the bets get a trial. On named sessions a trial (the first one
too) may also spend ``credit / backoff`` capacities below the score it starts from
(the bets' keeps pay later than they cost, so a trial needs some credit; each lost trial costs that
much at most, and they grow rarer), but never more than ``credit_per_allowance``
allowances: a credit in capacities alone let a short trace lose up to two of them
(a generated chat trace of 3,530 lookups behind an engine cache: 214 blocks of
credit, the trace 1.05 points below LRU with the guard never handing over), while
the early dips the credit is there for (a RAG trace: three blocks down, then 32 up)
are a few allowances deep. That bound needs an exact ghost, which it is with one tier
worth loading from; with two or more (DRAM and disk) it is one LRU over their
capacities whose copies are instant, while the disk's write-backs take time and a
block that leaves DRAM before its copy lands is gone: on the agent trace (first
5,000 requests, engine 500, DRAM 1,000, disk 20,000) it counted about 2% of the
lookups more hits for LRU than LRU makes, twenty-five allowances, and a credit
bounded by allowances handed the lead to LRU for nothing (305 prefill seconds
lost). There the credit stays in capacities. On traffic that names no session (the engine
inferred the sessions) a trial starts only while the score is above
``-allowance``: those bets have no statement from the client to go on, so they
spend only what the trace allows, and the total loss stays within the allowance
(plus the last request's and the hand-over's misses). This is ARC's and
LeCaR/CACHEUS's online measurement with ghost lists, applied to the choice between
a learned policy and its baseline: one exact ghost for the baseline (cheap, since
LRU needs only keys and order) and the doubling trick of online learning for the
expert, whose own ghost (below) decides only when a trial may start.

With more than one tier the ghost has the capacity of every tier worth loading from,
and the real score is the prefix served from any of them (an approximation of LRU
with demotion). Every ghost plays the engine's retention shield from what clients
retained (:class:`~kvstore.policies.shadow.Retained`, filled by the adaptive policy's
``on_retain``): before, the LRU ghost hit 9-15% fewer blocks than LRU on traces whose
clients retain their shared prefixes, and the score took LRU's losses for the bets'
gains.

The score reacts to what the bets lost, after it is lost. With one tier worth loading
from, named sessions' blocks are placed by a two-way proof instead (a hysteresis: no
hand-over on a lead that only flips). The bets are played on their own ghost
(:class:`~kvstore.policies.shadow.WorkloadGhost`) over every named lookup; LRU places
the blocks until the ghost's hits minus the LRU ghost's since the bets last handed
back (or started), counted from their lowest point since then (``shown``, never below
zero), reach ``prove`` times the square root of the sum of the squared per-request
differences over the same requests (at least ``min_allowance``), or the same on
per-block differences (each request's difference over its length, so that a few
requests of hundreds of blocks do not make the whole variance): a one-sided test of
the bets' gain at ``prove`` standard deviations (``proven``). Counted from their lowest
point, a losing phase does not hold a later gain back by its deficit; its variance
still counts, so the gain must stand out of the spread of every request since the
hand-back. On the agent trace behind an engine cache at DRAM 5,000 the bets were
handed back at the 576th named request, their ghost fell 1,246 blocks behind LRU's by
the 1,500th and then gained: carried from the hand-back (floored at ``-bank`` only),
the deficit put the proof at the 5,691st; from the lowest point it comes at the
4,261st, and the run saves 38,214 prefill seconds against 37,984 (``ttl`` 38,011,
``workload`` alone 38,468). A restart of the variance too (Page's CUSUM) proved them
too often where they lose: the generated mix of tests/replay/test_adaptive_replay.py
whose bets lose ended 0.29 points below LRU. What bounds the loss where the bets lose
is the hand-back below; each proof that comes sooner is one more trial it bounds.
Their first proof may also come from the client: a named lookup whose turn, it says,
ends in a tool call (``RequestInfo.then``) is the traffic the bets were built for (an
agent's session waits on its tool, and its chain comes back within the tool's
latency), so it proves them until a hand-back; after one, only their ghost does. On
the agent trace behind an engine cache that saves the 146 requests the ghost took to
prove them at DRAM 1,000 (0.95 points); the hand-back below bounds what it costs where
they lose.
From then the bets place them, until LRU's lead over them is proven, in blocks: their
real prefix hits minus the LRU ghost's since they were proven (at most ``bank``) below
``-prove_back`` (1.5) times the square root of the sum of its squares (and
``-min_allowance``; below ``prove``: at 2 a generated mix whose bets lose,
tests/replay/test_adaptive_replay.py, ended 0.54 points below LRU, at 1.5 within 0.2;
not per block: on the agent trace at DRAM 2,000 a per-block test handed back at the
104th request, where the bets' lead in blocks held). The trial's credit, the allowance
and the probations are not used there. What that guarantees, as far as the ghosts
count what LRU and the bets serve: while the bets place named sessions' blocks, their
loss to LRU since they were proven stays within ``prove_back`` standard deviations of
the paired per-request difference (plus the last request's difference), and they place
again only after their ghost has shown a gain of that size; the trace's loss to LRU is
bounded per lead by that, not by the allowance (which still bounds traffic without
named sessions and two tiers or more).

The ghosts play the engine's stores as the engine makes them: a lookup is played when
it comes, its store when the engine's ends (``Policy.on_stored``; or when a hint ends
the request, or at once where the engine stores nothing), and a store of decode blocks
keeps the chain they continue (``RequestInfo.continues``). With stores at the lookup
the LRU ghost counted LRU 12-13 points short on the agent trace behind an engine cache
and flattered the bets by as much (``scripts/ghost_error.py``); with those exact ghosts
the bets' lead on the agent trace, carried by requests of hundreds of blocks, takes
hundreds of requests to prove, and a hand-back on the score alone (the allowance)
handed the lead back and forth (see docs/benchmarks/replay.md). The stores that wait
for the engine's are kept by :class:`~kvstore.policies.pending.PendingStores`.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvstore.policies.base import RequestInfo
from kvstore.policies.lru_ghost import LRUGhost
from kvstore.policies.shadow import FrequencyGhost, Retained, WorkloadGhost

if TYPE_CHECKING:
    from kvstore.policies.base import TierSpec
    from kvstore.policies.cost import CostModel
    from kvstore.policies.frequency import FrequencyPolicy
    from kvstore.policies.pending import LookupStores, PendingStores

__all__ = ["Guard"]


class Guard:
    """The score and who leads, a part of
    :class:`~kvstore.policies.adaptive.AdaptivePolicy`."""

    if TYPE_CHECKING:
        # What this part reads and writes of the policy (set in Policy.__init__ and
        # AdaptivePolicy.__init__).
        tiers: tuple[TierSpec, ...]
        _order: dict[str, int]
        freq: FrequencyPolicy
        unnamed: float | None
        window: float
        bank: float
        credit: float
        credit_per_allowance: float
        allowance_per_root: float
        min_allowance: float
        max_backoff: int
        floor_share: float
        _worth: tuple[bool, ...]
        floor: str | None
        room_lost: float
        looked: float
        floor_lru: bool
        _ghost: LRUGhost | None
        _fghost: FrequencyGhost | None
        _retained: Retained
        count_advantage: float
        _wghost: WorkloadGhost | None
        shown: float
        shown_swing: float
        proven: bool
        prove: float
        prove_back: float
        cost: CostModel
        _bet_options: dict[str, float]
        _span: float
        _blocks: int
        _bank: float
        _credit: float
        advantage: float
        swing: float
        _trial: tuple[float, float] | None
        leader: str
        switches: int
        _backoff: int
        _left: float
        _size: int
        _stores: PendingStores
        _lead: float
        _lead_swing: float
        _shown_pb: float
        _shown_pb_swing: float
        _named: int
        _mean_n: float
        proofs: int
        handbacks: int

    # -- the ghosts' stores, played when the engine's are ------------------------------
    def _play_stores(self, pend: LookupStores, now: float) -> None:
        """Make one lookup's ghost stores: the ``play`` handed to ``_stores``
        (:class:`~kvstore.policies.pending.PendingStores`), which calls it when the
        engine's store ends, when a hint ends the request, or at once where the engine
        stores nothing."""
        req = pend.req
        size = pend.size
        if pend.g < len(req.keys) and self._ghost is not None:
            self._ghost.store(req.keys, pend.g, size, now, req.continues)
        if pend.f and self._fghost is not None:
            self._fghost.store(req, pend.f, size, now)
        if pend.w and self._wghost is not None:
            self._wghost.store(req, pend.w, size, now)

    # -- the score ----------------------------------------------------------------------
    def _proven(self) -> None:
        """The bets place named sessions' blocks from now."""
        self.proven = True
        self.proofs += 1
        self._lead = self._lead_swing = 0.0
        if self.leader == "bets" and self._trial is not None:
            self._trial = (self.advantage, self._trial[1])  # the trial starts here

    def _shows(self, s: float, x: float) -> bool:
        """Add one named request's paired difference (its hits on the bets' ghost minus
        the LRU ghost's: ``s`` in blocks, ``x`` per block of the request) to the evidence,
        and whether it now proves the bets' gain. The sums count from their lowest point
        (they never fall below zero: a losing phase's deficit is not carried into a later
        gain) against the spread of every difference since the last hand-back (see the
        module's docstring)."""
        self.shown_swing += s * s
        self.shown = max(0.0, self.shown + s)
        self._shown_pb_swing += x * x
        self._shown_pb = max(0.0, self._shown_pb + x)
        return ((self.shown >= max(self.min_allowance,
                                   self.prove * math.sqrt(self.shown_swing)))
                or (self._shown_pb * self._mean_n >= self.min_allowance
                    and self._shown_pb >= self.prove * math.sqrt(self._shown_pb_swing)))

    def _start(self, block_bytes: int) -> LRUGhost:
        cap = sum(t.capacity_bytes for i, t in enumerate(self.tiers) if self._worth[i])
        self._size = max(block_bytes, 1)
        retained = self._retained
        self._ghost = LRUGhost(cap, retained)
        self._fghost = FrequencyGhost(cap, retained=retained)
        if self.floor is None:  # one tier worth loading from: the bets prove themselves
            self._wghost = WorkloadGhost(cap, self.cost, retained=retained,
                                         **self._bet_options)
        else:  # (the floor keeps LRU's hits; the bets' worth is which tier: no ghost sees it)
            self.proven = True
        blocks = self._blocks = max(1, cap // self._size)
        # The window is traffic, so it is counted in bytes looked up: in blocks of the
        # first lookup's size, a server whose first namespace had 1 MiB blocks closed a
        # window of 4 KiB lookups 256 times too soon. The score, the bank and the credit
        # count hit bytes in blocks of that first size (see _score).
        self._span = self.window * cap
        self._bank = self.bank * blocks
        self._credit = self.credit * blocks
        self._trial = (0.0, self._credit)  # the first trial's credit (named sessions)
        self._left = self._span
        return self._ghost

    def _served(self, req: RequestInfo) -> int:
        worth = req.worth or self._worth
        tiers = req.hit_tiers
        n = tiers.index(None) if None in tiers else len(tiers)  # the stored prefix
        if n and not all(worth):
            # its first tier not worth loading from ends it (one pass per such tier)
            order = self._order
            cut = [t for t in set(tiers[:n]) if not worth[order[t]]]
            if cut:
                n = min(tiers.index(t) for t in cut)
        return n

    def allowance(self) -> float:
        """What the trace may lose to LRU so far, in blocks: ``allowance_per_root``
        sqrt(sum of squared per-request differences), at least ``min_allowance``."""
        return max(self.min_allowance, self.allowance_per_root * math.sqrt(self.swing))

    def _floor(self) -> float:
        """The score below which the bets lose the lead: ``-allowance``, or on a trial
        with credit, what it started from less its credit, if lower. With one tier
        worth loading from, the credit is at most ``credit_per_allowance`` allowances;
        with more, the ghost only approximates LRU (see the module's docstring) and
        the credit stays in capacities."""
        allowance = self.allowance()
        if self._trial is None:
            return -allowance
        start, credit = self._trial
        if self.floor is None:
            credit = min(credit, self.credit_per_allowance * allowance)
        return min(-allowance, start - credit)

    def _score(self, req: RequestInfo, now: float) -> None:
        """Play the lookup on the ghost and add the paired difference (real prefix hits
        minus the ghost's) to the score, whoever leads; hand over to LRU once the score
        is below ``-allowance`` (or the trial's floor), and back to the bets for a trial
        after each probation (where no session is named, only while the score is above
        ``-allowance``)."""
        ghost = self._ghost
        if ghost is None:
            if not req.block_bytes:
                return  # sizes unknown: nothing stored yet, nothing to compare
            ghost = self._start(req.block_bytes)
        n = len(req.keys)
        size = req.block_bytes or self._size
        # Every difference below counts bytes, in blocks of the first lookup's size: a
        # 4 KiB block a namespace hits is 1/256 of a 1 MiB one another hits (each
        # counted as one hit block, the guard weighed the small namespace 256 times too
        # much). With one block size the weight is 1.
        wt = size / self._size
        g = ghost.lookup(req.keys)  # (its stores wait for the engine's: _stores)
        pend = self._stores.add(req, size, g, now)
        self._left -= n * size
        d = math.exp(-(n * size) / self._span)
        if not req.session_named and self._fghost is not None:
            f, pend.f = self._fghost.lookup(req, size, self.freq.counted)
            self.count_advantage = self.count_advantage * d + (f - g) * wt
        self.room_lost = self.room_lost * d + ghost.lost * wt
        self.looked = self.looked * d + n * wt
        self.floor_lru = (self.floor is not None
                          and self.room_lost <= self.floor_share * self.looked)
        # On named sessions with one tier worth loading from, the two-way proof decides
        # who places their blocks (see the module's docstring): the bets from a proven
        # lead of their ghost over LRU's, LRU again from a proven lead over the bets.
        wghost = self._wghost
        named = (wghost is not None and req.session_named
                 and (self.unnamed is None or self.unnamed <= 0.5))
        if req.session_named and wghost is not None:
            if n:
                self._named += 1
                self._mean_n += (n * wt - self._mean_n) / min(self._named, 1024)
            # (it plays every named lookup, proven or not: it must show a gain again
            # after a hand-back, and a ghost that rested would start that cold)
            w, pend.w = wghost.lookup(req, size, now)
            if not self.proven and not self.proofs and req.then == "tool_call":
                # The client says the session waits on a tool: the traffic the bets
                # were built for. That is their first proof; the hand-back's test is
                # the same as after any other.
                self._proven()
            if not self.proven and self._shows((w - g) * wt, (w - g) / n if n else 0.0):
                self._proven()
        diff = (self._served(req) - g) * wt
        self.swing += diff * diff
        self.advantage = min(self.advantage + diff, self._bank)
        if named and self.proven:
            # the bets' real hits minus the LRU ghost's since they were proven (at most
            # the bank): they place until LRU's lead over them is proven as theirs was
            self._lead = min(self._lead + diff, self._bank)
            self._lead_swing += diff * diff
            if -self._lead >= max(self.min_allowance,
                                  self.prove_back * math.sqrt(self._lead_swing)):
                self.proven = False  # the bets' ghost shows a gain again before they place
                self.shown = self._shown_pb = 0.0
                self.shown_swing = self._shown_pb_swing = 0.0
                self.handbacks += 1
        if named and self.leader == "bets":  # (the two-way proof decides, not the score)
            if self._left <= 0:
                self._backoff = max(1, self._backoff // 2)
                self._left = self._backoff * self._span
            return
        if self.leader == "bets":
            if self.advantage < self._floor():  # lost
                self.leader = "lru"
                if self.proven and self._wghost is not None:
                    self.handbacks += 1
                self.proven = False  # the bets' ghost shows a gain again before they place
                self.shown = min(self.shown, 0.0)
                self.shown_swing = 0.0
                self.switches += 1
                self._left = self._backoff * self._span  # probation
                self._backoff = min(self._backoff * 2, self.max_backoff)
            elif self._left <= 0:  # the bets held as long as their last probation
                self._backoff = max(1, self._backoff // 2)
                self._left = self._backoff * self._span
        elif self._left <= 0:
            unnamed = self.unnamed is not None and self.unnamed > 0.5
            if unnamed and self.advantage < -self.allowance():
                return  # nothing left to spend: LRU stays (checked every request)
            self.leader = "bets"  # a trial
            self.switches += 1
            self._trial = None if unnamed else (self.advantage, self._credit / self._backoff)
            self._left = self._backoff * self._span
