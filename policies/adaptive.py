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

The bets are scored paired against a ghost of LRU, whoever leads
(:mod:`~kvstore.policies.guard`): they lead while the score stays above what the
trace may lose to LRU (an allowance that grows as the square root of the evidence);
below it *lru* takes over for a probation, after which the bets get a trial, on
named sessions with some credit.

On named sessions, with one tier worth loading from, the bets place nothing until
they have shown on their own ghost (:class:`~kvstore.policies.shadow.WorkloadGhost`,
keys only) that they would have hit more than the LRU ghost by ``prove`` standard
deviations of the paired per-request difference, in blocks or per block (``proven``);
until then LRU places the blocks (unless a client says its session waits on a tool
call: the traffic the bets were built for proves them first), and from then the bets
do until LRU's lead over them (the real hits against the LRU ghost's, in blocks) is
proven at ``prove_back`` standard deviations (a two-way proof:
:mod:`~kvstore.policies.guard`). A
guard that only measures the real tiers reacts after a loss, and one request can
lose a returning session's whole chain: on the served grid's short traces
(``scripts/replay_grid.py --engine-share 0.05``) that put three of 135 points 0.28-0.54
points below LRU, where the bets' ghost never proves them. The price is the time the
ghost takes to prove a real gain (on those traces, part of the gain at the tightest
capacity). With two tiers or more the floor (below) keeps LRU's hits, and what the
bets win there is which tier serves a block, which no hit-counting ghost sees: there
the bets are proven from the start.

Traffic that names no sessions (the engine infers them from prefixes and says so:
``RequestInfo.session_named`` is false) gets other bets while they pay: per-block
reuse counts (:class:`~kvstore.policies.frequency.FrequencyPolicy`, which sees every
call as the others do). Over such requests a ghost of those counts (keys only) is
played next to the LRU ghost; while most recent requests name no session and the
counts' ghost has hit more than LRU's over the score window by more than
``counts_lead`` allowances and by more than ``counts_share`` of the tier's blocks (a
tier that changes hands misses for a while what the other kept, and how much it can
miss grows with the tier), the counts are the bets; otherwise LRU places the blocks
(the workload bets on inferred sessions lost to LRU on most generated kinds, by up to
5 points; their ghost, below, plays named sessions only). Without the share, on a
loose tier (the served grid's ``reasoning`` sessionless, seed 15 at 60%: 285 blocks)
the counts' ghost crossed four blocks of lead a few times, led 11 requests and lost 4
blocks of 927 to LRU (-0.43 points); where the counts win, their ghost's lead reaches
a tenth of the tier or more.

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

Pure: no clock, no I/O; time is an argument.
"""

from __future__ import annotations

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
from kvstore.policies.frequency import FrequencyPolicy
from kvstore.policies.guard import Guard
from kvstore.policies.lru import LRUPolicy
from kvstore.policies.lru_ghost import LRUGhost
from kvstore.policies.pending import PendingStores
from kvstore.policies.shadow import FrequencyGhost, Retained, WorkloadGhost
from kvstore.policies.workload import WorkloadPolicy

__all__ = ["AdaptivePolicy", "LRUGhost"]

#: Per request: how fast the share of requests without a named session follows the
#: traffic (about the last 64 requests).
_UNNAMED_DECAY = 1.0 - 1.0 / 64


class AdaptivePolicy(Guard, Policy):
    """The bets (:class:`~kvstore.policies.workload.WorkloadPolicy`, or the reuse
    counts on sessionless traffic) and LRU over the same tiers, the leader chosen by
    the guard (:class:`~kvstore.policies.guard.Guard`)."""

    name = "adaptive"

    def __init__(self, tiers: Sequence[TierSpec], cost: CostModel | None = None,
                 hbm_keep_max_s: float = 10.0, window: float = 16.0, bank: float = 2.0,
                 allowance_per_root: float = 0.2, min_allowance: float = 1.0,
                 credit: float = 2.0, credit_per_allowance: float = 4.0,
                 counts_lead: float = 4.0, counts_share: float = 0.03, max_backoff: int = 64,
                 floor_share: float = 0.01, prove: float = 2.0, prove_back: float = 1.5,
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
        if counts_share < 0:
            raise ValueError(f"counts_share must be >= 0, got {counts_share}")
        if max_backoff < 1:
            raise ValueError(f"max_backoff must be >= 1, got {max_backoff}")
        if not 0 <= floor_share < 1:
            raise ValueError(f"floor_share must be in [0, 1), got {floor_share}")
        if prove < 0 or prove_back < 0:
            raise ValueError(f"prove and prove_back must be >= 0, got {prove} and "
                             f"{prove_back}")
        self.cost = cost or CostModel()
        #: the bets expert; ``bets`` options (margin, window_s, keep_gap_s) go to it
        self.bets = WorkloadPolicy(tiers, self.cost, hbm_keep_max_s=hbm_keep_max_s, **bets)
        self._bet_options: dict[str, float] = dict(bets, hbm_keep_max_s=hbm_keep_max_s)
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
        #: the least lead of the counts' ghost, as a share of the tier's blocks
        self.counts_share = counts_share
        self.max_backoff = max_backoff
        self.floor_share = floor_share
        self.prove = prove
        #: how many standard deviations LRU's lead over the bets must reach (named
        #: sessions, one tier) before it places their blocks again
        self.prove_back = prove_back
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
        self._retained = Retained()
        #: the reuse counts' own ghost, played on requests that name no session, and
        #: its decayed hits minus the LRU ghost's: the counts bet only while it is > 0
        self._fghost: FrequencyGhost | None = None
        self.count_advantage = 0.0
        #: the named-session bets' own ghost, and its hits minus the LRU ghost's since
        #: the bets last lost the lead, counted from their lowest point (and the sum of
        #: their squares, over every request since): on named sessions the bets place
        #: blocks only once it is ``prove`` roots above zero
        self._wghost: WorkloadGhost | None = None
        self.shown = 0.0
        self.shown_swing = 0.0
        self.proven = False
        self._span = 1.0  # the score window, in looked-up bytes
        self._blocks = 1  # the ghosts' capacity, in blocks
        self._bank = 0.0  # blocks
        self._credit = 0.0  # blocks
        #: the score: real prefix hits - the ghost's over the trace, whoever leads, at
        #: most the bank
        self.advantage = 0.0
        self.swing = 0.0  # the sum of squared per-request differences
        #: a trial on named sessions: the score it started from and the most it may
        #: spend below it (blocks); None: a trial without credit
        self._trial: tuple[float, float] | None = None
        #: "bets" or "lru"
        self.leader = "bets"
        self.switches = 0
        self._backoff = 1  # probation length, in windows
        self._left = 0.0  # bytes to look up left in the current probation or trial
        self._size = 1
        #: the ghosts' stores of the lookups whose engine stores have not come yet
        self._stores = PendingStores()
        #: the two-way proof: the bets' real hits minus the LRU ghost's since they were
        #: last proven (at most the bank) and the sum of its squares; the bets' ghost's
        #: lead per block (each request's over its length) and its squares; named
        #: requests seen and their mean length (the last 1,024)
        self._lead = self._lead_swing = 0.0
        self._shown_pb = self._shown_pb_swing = 0.0
        self._named = 0
        self._mean_n = 1.0
        #: how many times the bets were proven, and handed named sessions back to LRU
        self.proofs = 0
        self.handbacks = 0

    @classmethod
    def from_config(cls, config: PolicyConfig, **options: Any) -> Self:
        """Takes the engine's cost model and its HBM keep limit (when given)."""
        if config.cost is not None:
            options["cost"] = config.cost
        if config.hbm_keep_max_s is not None:
            options["hbm_keep_max_s"] = config.hbm_keep_max_s
        return cls(config.tiers, **options)

    # -- placement ----------------------------------------------------------------------
    def _choose_bettor(self, req: RequestInfo) -> None:
        """Sessions named (most of the recent requests): the workload bets once
        ``proven`` on their ghost, LRU until then; none named
        (the engine inferred them from prefixes): the per-block reuse counts, while
        their ghost has hit more than the LRU ghost over the score window by more than
        ``counts_lead`` allowances and ``counts_share`` of the tier's blocks, else LRU.
        The score goes on across a change (it is the trace's, not the bettor's)."""
        x = 0.0 if req.session_named else 1.0
        self.unnamed = x if self.unnamed is None else (
            self.unnamed * _UNNAMED_DECAY + x * (1.0 - _UNNAMED_DECAY))
        if self.unnamed <= 0.5:
            self._bettor = self.bets if self.proven else self.lru
        elif self.count_advantage > max(self.counts_lead * self.allowance(),
                                        self.counts_share * self._blocks):
            self._bettor = self.freq
        else:
            self._bettor = self.lru

    def on_request(self, req: RequestInfo, now: float) -> Plan:
        plan = self._plan(req, now)
        # (the ghosts store when the engine does)
        self._stores.hold(bool(plan.admit), self._play_stores)
        return plan

    def on_stored(self, keys: Sequence[Hashable], now: float) -> None:
        self._stores.stored(keys, now, self._play_stores)

    def _plan(self, req: RequestInfo, now: float) -> Plan:
        freq = self.freq.on_request(req, now)  # first: the counts' ghost reads its counts
        self._score(req, now)
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
        self._stores.flush(hint, now, self._play_stores)  # (its request has ended)
        moves = self.bets.on_hint(hint, keys, now)  # it learns from every hint
        if self._wghost is not None:  # (its ghost too: one tier, it moves nothing)
            self._wghost.policy.on_hint(hint, (), now)
        return moves if self.leader == "bets" and self._bettor is self.bets else []

    # -- bookkeeping: both experts see everything ------------------------------------------
    def on_insert(self, info: BlockInfo, tier: str, now: float) -> None:
        self.bets.on_insert(info, tier, now)
        self.freq.on_insert(info, tier, now)
        self.lru.on_insert(info, tier, now)
        self._link((info,))

    def on_insert_many(self, infos: Sequence[BlockInfo], tier: str, now: float) -> None:
        if type(self).on_insert is not AdaptivePolicy.on_insert:  # a subclass's own insert
            super().on_insert_many(infos, tier, now)
            return
        self.bets.on_insert_many(infos, tier, now)
        self.freq.on_insert_many(infos, tier, now)
        self.lru.on_insert_many(infos, tier, now)
        self._link(infos)

    def _link(self, infos: Sequence[BlockInfo]) -> None:
        """The ghosts learn whose children the stored blocks are: a request's decode
        blocks reach them as a request of their own, its first block's parent unknown
        (the prompt's last block: the engine evicts them before it)."""
        ghost = self._ghost
        if ghost is None:
            return
        indexes = [ghost.children]
        for g in (self._fghost, self._wghost):
            if g is not None:
                indexes.append(g.children)
        pairs = [(info.key, info.parent) for info in infos if info.parent is not None]
        if pairs:
            for idx in indexes:
                idx.link_many(pairs)

    def on_access(self, key: Hashable, tier: str, now: float) -> None:
        self.bets.on_access(key, tier, now)
        self.freq.on_access(key, tier, now)
        self.lru.on_access(key, tier, now)

    def on_access_many(self, keys: Sequence[Hashable], tiers: Sequence[str], now: float
                       ) -> None:
        self.bets.on_access_many(keys, tiers, now)
        self.freq.on_access_many(keys, tiers, now)
        self.lru.on_access_many(keys, tiers, now)

    def on_retain(self, keys: Sequence[Hashable], until: float, now: float) -> None:
        self._retained.add(keys, until, now)
        self.bets.on_retain(keys, until, now)
        self.freq.on_retain(keys, until, now)
        self.lru.on_retain(keys, until, now)

    def settle(self) -> None:
        self.bets.settle()
        self.freq.settle()
        self.lru.settle()
        if self._fghost is not None:  # (the counts' ghost refiles its hits later too)
            self._fghost.policy.settle()

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
