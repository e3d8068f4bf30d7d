"""The profile as text: one block per section, then the notes."""

from __future__ import annotations

from kvstore.profile.dist import Dist
from kvstore.profile.model import Curve, Profile, Sessions, Sizing
from kvstore.profile.quadrants import AGENT_INPUT, LONG_INPUT, LONG_OUTPUT, QUADRANTS
from kvstore.profile.sizing import MODELS

__all__ = ["format_profile"]

_HEAD = f"{'':28}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}{'max':>10}"


def _num(x: float) -> str:
    if x == int(x):
        return f"{int(x):,}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}"


def _row(label: str, d: Dist | None, missing: str = "n/a") -> str:
    if d is None:
        return f"  {label:26}{missing}"
    return (f"  {label:26}" + "".join(f"{_num(v):>10}" for v in (d.p50, d.p90, d.p99, d.mean,
                                                                    d.max)))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _sessions(s: Sessions) -> list[str]:
    how = "inferred from prefix chains" if s.inferred else "from session ids"
    out = [f"Sessions: {s.sessions:,} ({how})", _HEAD,
           _row("calls per session", s.calls_per_session),
           _row("tokens read back per call", s.read_back_tokens),
           _row("new tokens per call", s.new_tokens)]
    out += [_row(f"gap after {k} (s)", d) for k, d in s.gaps_s.items()]
    out.append(_row("session duration (s)", s.duration_s))
    return out


def _curve(c: Curve, block_tokens: int, bpt: int | None) -> list[str]:
    pols = c.policies()
    caps = sorted({p.blocks for p in c.points})
    rate = {(p.policy, p.blocks): p.hit_rate for p in c.points}
    gb = f"{'GB':>9}" if bpt else ""
    out = [f"Hit rate vs capacity (one tier of N {block_tokens}-token blocks; unbounded "
           f"{_pct(c.unbounded_hit_rate)})",
           f"  {'blocks':>9}{gb}" + "".join(f"{p:>11}" for p in pols)]
    for cap in caps:
        size = f"{cap * block_tokens * bpt / 1e9:9.1f}" if bpt else ""
        out.append(f"  {cap:>9,}{size}" + "".join(
            f"{_pct(rate.get((p, cap))):>11}" for p in pols))
    return out


def _sizing(s: Sizing) -> list[str]:
    out = [f"Sizing for {s.model} ({s.kv_bytes_per_token:,} B of KV per token)",
           f"  {'target':>8}{'tier':>6}{'hit rate':>10}{'blocks':>13}{'GB':>12}  "
           f"{'best policy':12}{'belady blocks':>14}"]
    for t in s.targets:
        le = "<= " if t.at_most else ""
        blocks = "not reached" if t.blocks is None else f"{le}{t.blocks:,}"
        gb = "" if t.gb is None else f"{le}{t.gb:.1f}"
        bel = ("-" if t.belady_blocks is None
               else f"{'<= ' if t.belady_at_most else ''}{t.belady_blocks:,}")
        out.append(f"  {100 * t.share:>7.0f}%{t.tier:>6}{_pct(t.hit_rate):>10}{blocks:>13}"
                   f"{gb:>12}  {t.policy or '-':12}{bel:>14}")
    if any(t.at_most for t in s.targets):
        out.append("  <=: the smallest capacity measured already reaches it (add --points)")
    if all(t.blocks for t in s.targets):
        out.append("  the same blocks for other models, GB at " +
                   " / ".join(f"{100 * t.share:.0f}%" for t in s.targets) + ":")
        for m in MODELS.values():
            gbs = " / ".join(f"{(t.blocks or 0) * s.block_tokens * m.bytes_per_token / 1e9:,.1f}"
                             for t in s.targets)
            out.append(f"    {m.name:16}{m.bytes_per_token:>9,} B/token  {gbs}")
    out.append("")
    out += ["  " + line if line else "" for line in s.toml.rstrip("\n").split("\n")]
    return out


def format_profile(p: Profile) -> str:
    a = p.arrival
    span = f"{a.span_s / 60:.1f} min" if a.span_s < 7200 else f"{a.span_s / 3600:.1f} h"
    window = f", window {p.window_s:.0f} s" if p.window_s is not None else ""
    out = [f"Workload profile of {p.source} ({p.format}{window}): {p.requests:,} requests "
           f"over {span}", "", "Lengths (tokens)" + _HEAD[16:]]
    ln = p.lengths
    out += [_row("input", ln.input_tokens), _row("output", ln.output_tokens),
            _row("input / output", ln.ratio), _row("context (input + output)",
                                                   ln.context_tokens)]
    total = max(1, sum(ln.quadrants.values()))
    out += ["", f"Quadrants (input >= {LONG_INPUT:,} long, >= {AGENT_INPUT:,} agent; output "
            f">= {LONG_OUTPUT:,} long)"]
    out += [f"  {QUADRANTS.get(q, q):26}{n:>10,}{100 * n / total:>9.1f}%"
            for q, n in ln.quadrants.items()]
    if ln.workloads:
        out.append("  declared: " + ", ".join(f"{w} {n:,}" for w, n in ln.workloads.items()))
    ptt = ("unbounded" if a.peak_to_trough is None and a.bins >= 2
           else "n/a" if a.peak_to_trough is None else f"{a.peak_to_trough:.2f}x")
    bins = "hourly" if a.bin_s == 3600 else "per-minute" if a.bin_s == 60 else f"{a.bin_s:g} s"
    cv = "n/a" if a.interarrival_cv is None else f"{a.interarrival_cv:.2f}"
    out += ["", "Arrival", f"  requests per minute       {a.requests_per_minute:,.1f} "
            f"(mean over the span)", _row("requests in a minute", a.per_minute),
            f"  peak / trough             {ptt} ({bins} bins: {a.peak:,} / {a.trough:,} "
            f"requests, {a.bins} complete bins)",
            f"  burstiness                {cv} (CV of inter-arrival times; 1 = Poisson)"]
    if p.reuse is not None:
        r = p.reuse
        out += ["", "Prefix reuse (unbounded cache, per block)",
                f"  hit rate                  {_pct(r.unbounded_hit_rate)} of "
                f"{r.block_lookups:,} block lookups"]
        if r.distinct_blocks is not None:
            out.append(f"  distinct blocks           {r.distinct_blocks:,} "
                       f"({_pct(r.single_use_share)} never reused)")
    if p.kv_bytes_per_token:
        out.append(f"  KV bytes per token        {p.kv_bytes_per_token:,.0f} (stored blocks)")
    if p.retained_blocks:
        back = p.retained_came_back or 0
        out += ["", "Retention (cache_ttl_s)",
                f"  retained blocks           {p.retained_blocks:,}",
                f"  came back while retained  {back:,} "
                f"({_pct(back / p.retained_blocks)})"]
    if p.sessions is not None:
        out += ["", *_sessions(p.sessions)]
    if p.curve is not None:
        bpt = p.sizing.kv_bytes_per_token if p.sizing else None
        out += ["", *_curve(p.curve, p.block_tokens, bpt)]
    if p.sizing is not None:
        out += ["", *_sizing(p.sizing)]
    if p.notes:
        out += ["", "Notes", *[f"  - {n}" for n in p.notes]]
    return "\n".join(out)
