"""Router side of the event stream: subscriber, prefix index, scorer.

Usable by any Python router::

    fleet = FleetSubscriber()
    await fleet.add_pod("pod-a", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", start_seq=0)
    await fleet.start()
    scorer = PrefixScorer(fleet.index)
    hashes = request_block_hashes(token_ids, PrefixHasher(16, "sha256_cbor", seed="0"))
    pod, score = scorer.best(hashes, ["pod-a", "pod-b"])
"""

from __future__ import annotations

from .index import PrefixIndex
from .scorer import DEFAULT_WEIGHTS, PrefixScorer, request_block_hashes
from .subscriber import FleetSubscriber, PodSubscriber

__all__ = [
    "DEFAULT_WEIGHTS",
    "FleetSubscriber",
    "PodSubscriber",
    "PrefixIndex",
    "PrefixScorer",
    "request_block_hashes",
]
