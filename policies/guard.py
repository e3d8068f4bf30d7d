"""The adaptive policy's guard: its bets scored, paired, against a ghost of LRU.

Part of :class:`~kvstore.policies.adaptive.AdaptivePolicy` (its score half): the
score, the allowance, the probations and the trials that decide which expert leads.

How the bets are scored: a ghost of LRU (keys only, bounded by the tier's
capacity, no bytes) replays every lookup as LRU would (a request's prefix hits up
to its first miss, then every key touched, last block first). It is the ghost of
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
from, the bets are also played on their own ghost
(:class:`~kvstore.policies.shadow.WorkloadGhost`) over named sessions' lookups while
they are not ``proven``; its hits minus the LRU ghost's since the bets last lost the
lead (``shown``, at least ``-bank``) must reach ``prove`` times the square root of
the sum of its squared per-request differences (at least ``min_allowance``) before
the bets place named sessions' blocks: a one-sided test of the bets' gain at
``prove`` standard deviations. Until then, and from each lost lead until it holds
again, LRU places them (the adaptive policy's bettor) and the trial's credit is
counted from the moment the bets are proven. Once proven the ghost rests (the real
score measures the bets) and picks the trace up again where it left it.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from kvstore.policies.base import RequestInfo
from kvstore.policies.children import ChildIndex, ghost_take
from kvstore.policies.lru import _at_the_end
from kvstore.policies.shadow import FrequencyGhost, Retained, WorkloadGhost

if TYPE_CHECKING:
    from kvstore.policies.base import TierSpec
    from kvstore.policies.cost import CostModel
    from kvstore.policies.frequency import FrequencyPolicy

__all__ = ["Guard", "LRUGhost"]


class LRUGhost:
    """LRU over keys only, ``capacity`` bytes: what LRU would hold (no payloads), its
    victims taken by the engine's rule (a chain's leaves before its ancestors: the
    adaptive policy links a request's decode blocks under their prompt from the stores).

    It also remembers the keys it evicted, up to ``capacity`` bytes more (ARC's B list):
    ``lost`` is how many keys of the last request were there, LRU's misses for want of
    room (the rest of its misses are keys it never saw, or saw too long ago)."""

    __slots__ = ("capacity", "children", "gone", "gone_used", "keys", "lost", "retained",
                 "used")

    def __init__(self, capacity: int, retained: Retained | None = None) -> None:
        self.capacity = capacity
        self.retained = retained
        self.keys: OrderedDict[Hashable, int] = OrderedDict()
        #: the chains the lookups showed (a key's parent: the key before it), so that
        #: victims go as the engine takes them (:func:`~kvstore.policies.children.ghost_take`)
        self.children = ChildIndex()
        self.used = 0
        self.gone: OrderedDict[Hashable, int] = OrderedDict()
        self.gone_used = 0
        self.lost = 0

    def request(self, keys: Sequence[Hashable], size: int, now: float = 0.0) -> int:
        """Play one lookup as LRU would; returns its prefix hits."""
        ghost = self.keys
        move = ghost.move_to_end
        if keys and _at_the_end(ghost, keys[::-1]):  # the last lookup's, again: nothing
            self.lost = 0  # to move
            return len(keys)
        try:  # all held: each touched, last block first, in one pass
            deque(map(move, reversed(keys)), 0)
            self.lost = 0
            return len(keys)
        except KeyError:
            pass  # one not held: the loops below make every move again, in order
        hits = 0
        for k in keys:
            if k not in ghost:
                break
            hits += 1
        gone = self.gone
        lost = 0
        add = self.children.add
        j = len(keys)
        for k in reversed(keys):  # the engine's order: the first block ends most recent
            j -= 1
            if k in ghost:
                move(k)
            else:
                n = gone.pop(k, None)
                if n is not None:
                    lost += 1
                    self.gone_used -= n
                self.used += size
                ghost[k] = size
                add(k, keys[j - 1] if j else None, size)
        if self.used > self.capacity:
            shield = (self.retained.shield(ghost, self.capacity, now) if self.retained
                      else None)
            for k in ghost_take(self.children, lambda: iter(ghost), set(keys), ghost,
                                self.used - self.capacity, shield):
                self._evict(k)
        while self.used > self.capacity and ghost:  # (the request alone fills it)
            self._evict(next(iter(ghost)))
        while self.gone_used > self.capacity and gone:
            self.gone_used -= gone.popitem(last=False)[1]
        self.lost = lost
        return hits

    def _evict(self, key: Hashable) -> None:
        n = self.keys.pop(key)
        self.children.remove(key)
        self.used -= n
        self.gone[key] = n
        self.gone_used += n



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
        shown_swing: int
        proven: bool
        prove: float
        cost: CostModel
        _bet_options: dict[str, float]
        _span: float
        _blocks: int
        _bank: float
        _credit: float
        advantage: float
        swing: int
        _trial: tuple[float, float] | None
        leader: str
        switches: int
        _backoff: int
        _left: float
        _size: int

    # -- the score ----------------------------------------------------------------------
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
        self._span = self.window * blocks
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
        g = ghost.request(req.keys, req.block_bytes or self._size, now)
        self._left -= n
        d = math.exp(-n / self._span)
        if not req.session_named and self._fghost is not None:
            f = self._fghost.request(req, req.block_bytes or self._size, self.freq.counted,
                                     now)
            self.count_advantage = self.count_advantage * d + f - g
        self.room_lost = self.room_lost * d + ghost.lost
        self.looked = self.looked * d + n
        self.floor_lru = (self.floor is not None
                          and self.room_lost <= self.floor_share * self.looked)
        if not self.proven and req.session_named and self._wghost is not None:
            # (once proven, the real score measures the bets: their ghost rests, and
            # takes up the trace again where it left it when they lose the lead)
            s = self._wghost.request(req, req.block_bytes or self._size, now) - g
            self.shown_swing += s * s
            self.shown = max(-self._bank, self.shown + s)
            if self.shown >= max(self.min_allowance, self.prove * math.sqrt(self.shown_swing)):
                self.proven = True  # the bets place named sessions' blocks from now
                if self.leader == "bets" and self._trial is not None:
                    self._trial = (self.advantage, self._trial[1])  # the trial starts here
        diff = self._served(req) - g
        self.swing += diff * diff
        self.advantage = min(self.advantage + diff, self._bank)
        if self.leader == "bets":
            if self.advantage < self._floor():  # lost
                self.leader = "lru"
                self.proven = False  # the bets' ghost shows a gain again before they place
                self.shown = min(self.shown, 0.0)
                self.shown_swing = 0
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
