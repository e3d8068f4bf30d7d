"""``kvstore``: serve, stats, events, replay, profile, and the tools (bench, loadtest,
torture, bench-tiers, ...: :mod:`kvstore.tools`)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from kvstore.errors import KVStoreError

__all__ = ["main"]

log = logging.getLogger("kvstore")

#: Subcommands contributed by other packages: module exposing add_parser(subparsers).
_PLUGINS = ("kvstore.replay.cli", "kvstore.profile.cli")


def _serve(args: argparse.Namespace) -> int:
    from kvstore.config import load_config

    overrides: dict[str, Any] = {}
    if args.listen:
        overrides.setdefault("server", {})["listen"] = args.listen
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.metrics_port is not None:
        overrides.setdefault("server", {})["metrics_port"] = args.metrics_port
    cfg = load_config(args.config, overrides=overrides)
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import faulthandler

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack
    sys.setswitchinterval(cfg.server.gil_switch_s)  # (the GIL's turns: server.gil_switch_s)
    from kvstore.server.app import run_served

    run_served(_run_server(cfg))
    return 0


async def _run_server(cfg: Any) -> None:
    from kvstore.server.app import KVStoreServer
    from kvstore.server.heap import keep_frozen, settle_startup

    server = KVStoreServer(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    keeper: asyncio.Task[None] | None = None
    try:
        await server.start()
        settle_startup()
        if cfg.server.gc_freeze_s > 0:
            keeper = loop.create_task(keep_frozen(cfg.server.gc_freeze_s))
        print(f"kvstore listening on {cfg.server.listen} (port {server.port}); "
              f"metrics on :{server.metrics_port or 'off'}; data dir {cfg.data_dir}; "
              f"{server.recovered} blocks recovered", flush=True)
        # (Not grpc's wait_for_termination: cancelling it breaks the later shutdown.)
        await stop.wait()
        log.info("stopping")
    finally:
        if keeper is not None:
            keeper.cancel()
        await server.stop()


def _stats(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from kvstore.client import KVStoreClient

    with KVStoreClient(args.address, timeout=args.timeout, shared_memory=False) as c:
        st = c.stats()
    if args.json:
        print(json.dumps(asdict(st), default=str, indent=2))
        return 0
    print(f"kvstore {st.version}: {st.blocks} blocks in {st.namespaces} namespaces; "
          f"lookups {st.lookups} (hit blocks {st.lookup_hit_blocks}, "
          f"missed {st.lookup_miss_blocks}); pending moves {st.pending_moves}")
    for t in st.tiers:
        pct = 100.0 * t.used_bytes / t.capacity_bytes if t.capacity_bytes else 0.0
        print(f"  {t.name:6} {t.medium.value:6} {t.used_bytes:>15,d} / {t.capacity_bytes:,d} "
              f"bytes ({pct:5.1f}%)  {t.blocks:>8,d} blocks  hits {t.hits:,d}  "
              f"evictions {t.evictions:,d}")
    for q in st.quotas:
        print(f"  quota {q.namespace_prefix!r} in {q.tier}: {q.used_bytes:,d} / "
              f"{q.limit_bytes:,d} bytes  evictions {q.evictions:,d}  refused {q.refused:,d}")
    for r in st.retention:
        print(f"  retained by {r.tenant!r} in {r.tier}: {r.retained_bytes:,d} / "
              f"{r.limit_bytes:,d} bytes")
    if st.retained_granted:
        print(f"  retention: granted {st.retained_granted:,d}  refused {st.retained_refused:,d}  "
              f"hits while retained {st.retained_returned:,d}  evicted {st.retained_evicted:,d}")
    return 0


#: Commands of the service itself: parsed without importing any plugin or tool, so a
#: ``kvstore serve`` process holds no measurement code.
_CORE = ("serve", "stats")


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstore", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the sidecar (embedded defaults: DRAM + disk)")
    s.add_argument("--config", help="TOML config file")
    s.add_argument("--listen", help="HOST:PORT to serve gRPC on (default 127.0.0.1:50051)")
    s.add_argument("--data-dir", help="directory for the disk tier (default ./kvstore-data)")
    s.add_argument("--metrics-port", type=int, help="Prometheus port (0 = off; default 9100)")
    s.set_defaults(func=_serve)

    s = sub.add_parser("stats", help="print a running server's statistics")
    s.add_argument("--address", default="127.0.0.1:50051")
    s.add_argument("--timeout", type=float, default=5.0)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_stats)
    if not plugins:
        return p

    for mod in _PLUGINS:
        try:
            module = importlib.import_module(mod)
        except ImportError as exc:
            if exc.name and mod.startswith(exc.name):
                continue  # that part of the product is not installed
            raise
        module.add_parser(sub)
    from kvstore import tools

    tools.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    core = bool(argv) and argv[0] in _CORE
    if not core:
        from kvstore import tools

        if argv and argv[0] in tools.PASSTHROUGH:  # a tool with its own argument parser
            return tools.run_passthrough(argv[0], argv[1:])
    args = build_parser(plugins=not core).parse_args(argv)
    try:
        return int(args.func(args))
    except KVStoreError as exc:
        print(f"kvstore {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
