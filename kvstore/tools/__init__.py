"""Tools above the service: benchmarks, crash torture, load test, and their one harness.

Nothing the server, engine, tiers, client or connectors import lives here (the layers
contract in ``pyproject.toml`` checks it); a tool may import any of them. Every tool is a
``kvstore <tool>`` subcommand (the CLI imports a tool's module only when it runs):

=====================  ==========================================  =======================
command                what it measures                            module
=====================  ==========================================  =======================
``bench``              data plane GB/s vs memcpy, lookup latency;  :mod:`.bench`,
                       ``--tls``: TLS vs plaintext                 :mod:`.bench_tls`
``bench-tiers``        one tier alone vs its raw baseline          :mod:`.tiers`
                       (``dram``, ``disk``, ``alloc``, ``restart``)
``bench-redis``        the Redis tier vs raw redis-py              :mod:`.bench_redis`
``bench-events``       event stream throughput and latency         :mod:`.bench_events`
``bench-loop``         the event loop's CPU per Lookup and per     :mod:`.bench_loop`
                       Reserve / Commit / Acquire block
``bench-gc``           the collector's pauses on the event loop,   :mod:`.bench_gc`
                       the heap frozen or not
``bench-lmcache``      LMCache backends vs the kvstore plugin      :mod:`.lmcache.bench`
``bench-lmcache-compare``, ``bench-lmcache-breakdown``             :mod:`.lmcache`
                       (run these three in the LMCache venv)
``torture``            ``kill -9`` under write load, verify        :mod:`.torture`
``loadtest``           many clients, mixed load, every byte read   :mod:`.loadtest`
``events``             tail a server's block events (not a         :mod:`.events_tail`
                       measurement: a client command)
=====================  ==========================================  =======================

:mod:`.harness` starts a real ``kvstore serve`` (:class:`~.harness.LocalServer`) and picks
free ports (:func:`~.harness.free_port`) for all of them and for the tests.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PASSTHROUGH", "add_parsers", "run_passthrough"]

#: Tools with their own argument parser: ``kvstore <name> ARGS`` calls ``main(ARGS)``.
PASSTHROUGH: dict[str, tuple[str, str]] = {
    "bench-tiers": ("kvstore.tools.tiers", "one tier vs its raw baseline (dram, disk, alloc, "
                    "restart)"),
    "bench-redis": ("kvstore.tools.bench_redis", "the Redis tier vs raw redis-py, same run"),
    "bench-events": ("kvstore.tools.bench_events", "event stream throughput and latency"),
    "bench-loop": ("kvstore.tools.bench_loop", "the event loop's CPU per Lookup and per "
                   "Reserve / Commit / Acquire block, in process"),
    "bench-gc": ("kvstore.tools.bench_gc", "the cyclic collector's pauses on the event loop, "
                 "heap frozen or not, in process"),
    "bench-lmcache": ("kvstore.tools.lmcache.bench",
                      "LMCache CPU / redis:// / kvstore plugin (LMCache venv)"),
    "bench-lmcache-compare": ("kvstore.tools.lmcache.compare",
                              "LMCache's redis:// vs the plugin, interleaved (LMCache venv)"),
    "bench-lmcache-breakdown": ("kvstore.tools.lmcache.breakdown",
                                "where a plugin retrieve's time goes (LMCache venv)"),
    "torture": ("kvstore.tools.torture", "kill -9 a real server under write load, verify"),
}

#: Tools that add their own subparser (``add_parser(subparsers)``).
_SUBPARSERS = ("kvstore.tools.events_tail", "kvstore.tools.bench", "kvstore.tools.loadtest")


def run_passthrough(name: str, argv: list[str]) -> int:
    """Run the passthrough tool ``name`` on ``argv``; its exit status."""
    main = importlib.import_module(PASSTHROUGH[name][0]).main
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse and the tools' own exits
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return int(rc or 0)


def add_parsers(sub: Any) -> None:
    """Every tool's subcommand (passthrough tools are listed; ``kvstore.cli`` runs them)."""
    for module in _SUBPARSERS:
        importlib.import_module(module).add_parser(sub)
    for name, (_module, help_text) in PASSTHROUGH.items():
        sub.add_parser(name, help=help_text, add_help=False)
