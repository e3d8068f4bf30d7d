"""Input and output lengths, their ratio, context length, and the quadrant mix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvstore.profile.dist import Dist
from kvstore.profile.model import Lengths, Row
from kvstore.profile.quadrants import QUADRANTS, classify

__all__ = ["length_stats"]


def length_stats(rows: Sequence[Row]) -> Lengths:
    outs = [r for r in rows if r.output_tokens is not None]
    quadrants = Counter(classify(r.input_tokens, r.output_tokens) for r in rows)
    order = [*QUADRANTS, *sorted(set(quadrants) - set(QUADRANTS))]
    workloads = Counter(r.workload for r in rows if r.workload)
    return Lengths(
        input_tokens=Dist.of(r.input_tokens for r in rows),
        output_tokens=Dist.of(r.output_tokens or 0 for r in outs),
        ratio=Dist.of(r.input_tokens / r.output_tokens for r in outs if r.output_tokens),
        context_tokens=Dist.of(r.input_tokens + (r.output_tokens or 0) for r in outs),
        quadrants={q: quadrants[q] for q in order if quadrants[q] or q in QUADRANTS},
        workloads=dict(sorted(workloads.items(), key=lambda kv: (-kv[1], kv[0]))),
    )
