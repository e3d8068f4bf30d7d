"""The workload policy's bets, guarded by what LRU would have done: never below LRU.

:class:`~kvstore.policies.workload.WorkloadPolicy` wins by betting: it refuses
admission to a newcomer worth less than the sessions it would push out, and it
evicts the least valuable session first. Where those bets are wrong (a mix whose
sessions come back later than their class says, a tier big enough that LRU keeps
everything worth keeping) it falls below LRU. This policy makes the bets pay for
themselves, measured online.

Two experts decide over the same tiers: *bets* (the workload policy) and *lru*
(LRU, admit everything). Both see every lookup, store, hit, removal and hint, so
either can take over at any request with a correct view of what is stored (and the
bets keep learning return times while LRU leads); only the *leader*'s admission,
eviction, demotion and hint moves are used.

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
expert that cannot be shadowed.

Traffic that names no sessions (the engine infers them from prefixes and says so:
``RequestInfo.session_named`` is false) gets other bets while they pay: per-block
reuse counts (:class:`~kvstore.policies.frequency.FrequencyPolicy`, which sees every
call as the others do). Over such requests a ghost of those counts (keys only) is
played next to the LRU ghost; while most recent requests name no session and the
counts' ghost has hit more than LRU's over the score window by more than
``counts_lead`` allowances (a tier that changes hands misses for a while what the
other kept), the counts are the bets; otherwise LRU places the blocks (the workload
bets on inferred sessions lost to LRU on most generated kinds, by up to 5 points,
and cannot be shadowed to tell when they would not).

The HBM keep (``Plan.keep_s``) always comes from *bets*: it uses the hints (what
the session waits on, the tool and its learned gaps) and its own ledger of whether
keeps paid (judged against what the sidecar served at the return), whichever
expert places the blocks in the sidecar's tiers.

The floor: with two tiers or more worth loading from, the slowest (the disk below
DRAM) is where a block goes last, and below it there is only recompute. While the
ghost says LRU loses almost nothing for want of room (the keys of its misses that it
had evicted, ARC's B list, under ``floor_share`` of the lookups in the window: a tier
that holds nearly everything), the floor keeps what LRU keeps, whoever leads: it
takes every block a tier above lets go (the bets drop what is worth nothing now) and
every newcomer the bets refused, and evicts oldest first (LRU's order, not the bets'
session values). There the bets can only lose hits: on the agent trace with disk
20,000 blocks they lost 0.02-0.15 points of hit rate to LRU, mostly to the disk's
evictions by session value, too few for the guard (then a slack of 2 capacities) to
see. Where LRU does lose for want of room, the floor is the bets' (an LRU floor then
churns: on a generated trace whose hints lie, tests/replay/test_lying_hints.py, it
fell below LRU's hit rate). The evicted-key list doubles the ghost's keys (no payloads).

Pure: no clock, no I/O; time is an argument. With more than one tier the ghost
has the capacity of every tier worth loading from, and the real score is the
prefix served from any of them (an approximation of LRU with demotion).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Container, Hashable, Iterable, Sequence
from typing import Any, Self

from kvstore.policies.base import (
    BlockInfo,
    Hint,
    Move,
    Plan,
    Policy,
    PolicyConfig,
    RequestInfo,
    TierSpec,
)
from kvstore.policies.cost import CostModel
from kvstore.policies.frequency import FrequencyGhost, FrequencyPolicy
from kvstore.policies.lru import LRUPolicy, _at_the_end
from kvstore.policies.workload import WorkloadPolicy

__all__ = ["AdaptivePolicy", "LRUGhost"]

#: Per request: how fast the share of requests without a named session follows the
#: traffic (about the last 64 requests).
_UNNAMED_DECAY = 1.0 - 1.0 / 64


class LRUGhost:
    """LRU over keys only, ``capacity`` bytes: what LRU would hold (no payloads).

    It also remembers the keys it evicted, up to ``capacity`` bytes more (ARC's B list):
    ``lost`` is how many keys of the last request were there, LRU's misses for want of
    room (the rest of its misses are keys it never saw, or saw too long ago)."""

    __slots__ = ("capacity", "gone", "gone_used", "keys", "lost", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[Hashable, int] = OrderedDict()
        self.used = 0
        self.gone: OrderedDict[Hashable, int] = OrderedDict()
        self.gone_used = 0
        self.lost = 0

    def request(self, keys: Sequence[Hashable], size: int) -> int:
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
        for k in reversed(keys):  # the engine's order: the first block ends most recent
            if k in ghost:
                move(k)
            else:
                n = gone.pop(k, None)
                if n is not None:
                    lost += 1
                    self.gone_used -= n
                self.used += size
                ghost[k] = size
        while self.used > self.capacity and ghost:
            k, n = ghost.popitem(last=False)
            self.used -= n
            gone[k] = n
            self.gone_used += n
        while self.gone_used > self.capacity and gone:
            self.gone_used -= gone.popitem(last=False)[1]
        self.lost = lost
        return hits


class AdaptivePolicy(Policy):
    name = "adaptive"

    def __init__(self, tiers: Sequence[TierSpec], cost: CostModel | None = None,
                 hbm_keep_max_s: float = 10.0, window: float = 16.0, bank: float = 2.0,
                 allowance_per_root: float = 0.2, min_allowance: float = 1.0,
                 credit: float = 2.0, credit_per_allowance: float = 4.0,
                 counts_lead: float = 4.0, max_backoff: int = 64, floor_share: float = 0.01,
                 **bets: float) -> None:
        super().__init__(tiers)
        if window <= 0 or bank < 0:
            raise ValueError(f"window must be > 0 and bank >= 0 (capacities), "
                             f"got {window} and {bank}")
        if min(allowance_per_root, min_allowance, counts_lead, credit,
               credit_per_allowance) < 0:
            raise ValueError(f"allowance_per_root, min_allowance, counts_lead, credit and "
                             f"credit_per_allowance must be >= 0, got {allowance_per_root}, "
                             f"{min_allowance}, {counts_lead}, {credit} and "
                             f"{credit_per_allowance}")
        if max_backoff < 1:
            raise ValueError(f"max_backoff must be >= 1, got {max_backoff}")
        if not 0 <= floor_share < 1:
            raise ValueError(f"floor_share must be in [0, 1), got {floor_share}")
        self.cost = cost or CostModel()
        #: the bets expert; ``bets`` options (margin, window_s, keep_gap_s) go to it
        self.bets = WorkloadPolicy(tiers, self.cost, hbm_keep_max_s=hbm_keep_max_s, **bets)
        #: the bets on traffic that names no sessions (per-block reuse counts)
        self.freq = FrequencyPolicy(tiers, self.cost)
        self.lru = LRUPolicy(tiers)
        #: decayed share of requests that named no session (from the first request on);
        #: over a half, ``freq`` bets
        self.unnamed: float | None = None
        self._bettor: Policy = self.bets
        self.window = window
        self.bank = bank
        self.credit = credit
        self.credit_per_allowance = credit_per_allowance
        self.allowance_per_root = allowance_per_root
        self.min_allowance = min_allowance
        self.counts_lead = counts_lead
        self.max_backoff = max_backoff
        self.floor_share = floor_share
        self._worth = tuple(self.cost.worth_loading(t) for t in tiers)
        worthy = [t.name for i, t in enumerate(self.tiers) if self._worth[i]]
        #: the floor: the slowest tier worth loading from, below a faster one (None with
        #: one such tier). While LRU loses almost nothing for want of room, it keeps what
        #: LRU keeps, whoever leads (see :meth:`victims`).
        self.floor: str | None = worthy[-1] if len(worthy) > 1 else None
        #: decayed LRU misses for want of room (the ghost's ``lost``) and lookups
        self.room_lost = 0.0
        self.looked = 0.0
        self.floor_lru = self.floor is not None
        self._ghost: LRUGhost | None = None
        #: the reuse counts' own ghost, played on requests that name no session, and
        #: its decayed hits minus the LRU ghost's: the counts bet only while it is > 0
        self._fghost: FrequencyGhost | None = None
        self.count_advantage = 0.0
        self._span = 1.0  # the score window, in looked-up blocks
        self._bank = 0.0  # blocks
        self._credit = 0.0  # blocks
        #: the score: real prefix hits - the ghost's over the trace, whoever leads, at
        #: most the bank
        self.advantage = 0.0
        self.swing = 0  # the sum of squared per-request differences
        #: a trial on named sessions: the score it started from and the most it may
        #: spend below it (blocks); None: a trial without credit
        self._trial: tuple[float, float] | None = None
        #: "bets" or "lru"
        self.leader = "bets"
        self.switches = 0
        self._backoff = 1  # probation length, in windows
        self._left = 0.0  # lookups left in the current probation or trial
        self._size = 1

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        """Takes the engine's cost model and its HBM keep limit (when given)."""
        if config.cost is not None:
            options["cost"] = config.cost
        if config.hbm_keep_max_s is not None:
            options["hbm_keep_max_s"] = config.hbm_keep_max_s
        return cls(config.tiers, **options)

    # -- the score ----------------------------------------------------------------------
    def _start(self, block_bytes: int) -> LRUGhost:
        cap = sum(t.capacity_bytes for i, t in enumerate(self.tiers) if self._worth[i])
        self._size = max(block_bytes, 1)
        self._ghost = LRUGhost(cap)
        self._fghost = FrequencyGhost(cap)
        blocks = max(1, cap // self._size)
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

    def _score(self, req: RequestInfo) -> None:
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
        g = ghost.request(req.keys, req.block_bytes or self._size)
        self._left -= n
        d = math.exp(-n / self._span)
        if not req.session_named and self._fghost is not None:
            f = self._fghost.request(req, req.block_bytes or self._size, self.freq.counted)
            self.count_advantage = self.count_advantage * d + f - g
        self.room_lost = self.room_lost * d + ghost.lost
        self.looked = self.looked * d + n
        self.floor_lru = (self.floor is not None
                          and self.room_lost <= self.floor_share * self.looked)
        diff = self._served(req) - g
        self.swing += diff * diff
        self.advantage = min(self.advantage + diff, self._bank)
        if self.leader == "bets":
            if self.advantage < self._floor():  # lost
                self.leader = "lru"
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

    # -- placement ----------------------------------------------------------------------
    def _choose_bettor(self, req: RequestInfo) -> None:
        """Sessions named (most of the recent requests): the workload bets; none named
        (the engine inferred them from prefixes): the per-block reuse counts, while
        their ghost has hit more than the LRU ghost over the score window by more than
        ``counts_lead`` allowances, else LRU. The score goes on across a change (it is
        the trace's, not the bettor's)."""
        x = 0.0 if req.session_named else 1.0
        self.unnamed = x if self.unnamed is None else (
            self.unnamed * _UNNAMED_DECAY + x * (1.0 - _UNNAMED_DECAY))
        if self.unnamed <= 0.5:
            self._bettor = self.bets
        elif self.count_advantage > self.counts_lead * self.allowance():
            self._bettor = self.freq
        else:
            self._bettor = self.lru

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        freq = self.freq.on_request(req, now)  # first: the counts' ghost reads its counts
        self._score(req)
        self._choose_bettor(req)
        bet = self.bets.on_request(req, now)
        lru = self.lru.on_request(req, now)
        if self.leader != "bets":
            return Plan(lru.admit, lru.moves, bet.keep_s)
        if self._bettor is self.freq:
            bet = Plan(freq.admit, freq.moves, bet.keep_s)
        elif self._bettor is self.lru:
            return Plan(lru.admit, lru.moves, bet.keep_s)
        floor = self.floor
        if floor is None or not self.floor_lru or len(bet.admit) == len(lru.admit):
            return bet
        # The floor admits what the bets refused everywhere above it: LRU keeps every
        # block, and below the floor there is only recompute. A partial last block
        # stays out (the bets' rule: the next turn rewrites it).
        keys = req.keys
        partial = bool(keys) and 0 < req.last_tokens < req.block_tokens
        admit = dict(bet.admit)
        for k in lru.admit:
            if k not in admit and not (partial and k == keys[-1]):
                admit[k] = floor
        return Plan(admit, bet.moves, bet.keep_s)

    def demote_to(self, key: Hashable, tier: str, now: float) -> str | None:
        if self.leader != "bets":
            return self.lru.demote_to(key, tier, now)
        dst = self._bettor.demote_to(key, tier, now)
        if dst is None and self.floor_lru:
            nxt = self.lru.demote_to(key, tier, now)
            if nxt == self.floor:  # the floor takes what the tier above lets go
                return nxt
        return dst

    def on_hint(self, hint: Hint, keys: Sequence[tuple[Hashable, str]], now: float) -> list[Move]:
        moves = self.bets.on_hint(hint, keys, now)  # it learns from every hint
        return moves if self.leader == "bets" and self._bettor is self.bets else []

    # -- bookkeeping: both experts see everything ------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.bets.on_insert(info, tier, now)
        self.freq.on_insert(info, tier, now)
        self.lru.on_insert(info, tier, now)

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        if type(self).on_insert is not AdaptivePolicy.on_insert:  # a subclass's own insert
            super().on_insert_many(infos, tier, now)
            return
        self.bets.on_insert_many(infos, tier, now)
        self.freq.on_insert_many(infos, tier, now)
        self.lru.on_insert_many(infos, tier, now)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        self.bets.on_access(key, tier, now)
        self.freq.on_access(key, tier, now)
        self.lru.on_access(key, tier, now)

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        self.bets.on_access_many(keys, tiers, now)
        self.freq.on_access_many(keys, tiers, now)
        self.lru.on_access_many(keys, tiers, now)

    def on_remove(self, key: Hashable, tier: str) -> None:
        self.bets.on_remove(key, tier)
        self.freq.on_remove(key, tier)
        self.lru.on_remove(key, tier)

    def victims(self, tier: str, protected: Container[Hashable], now: float
                ) -> Iterable[Hashable]:
        """The leader's order; the floor's is LRU's while ``floor_lru`` (with everything
        a tier above lets go and every refused newcomer admitted there, it holds what
        LRU's slowest tier would: where it holds nearly everything, LRU's recency wins
        the bets' session values, which can only lose hits there)."""
        if tier == self.floor and self.floor_lru:
            return self.lru.victims(tier, protected, now)
        if self.leader == "bets":
            return self._bettor.victims(tier, protected, now)
        return self.lru.victims(tier, protected, now)
