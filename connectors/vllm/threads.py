"""The connector's own threads, free to run on any CPU the process may use.

vLLM's CPU worker pins its main thread to one core (it is OpenMP's master
thread: ``VLLM_CPU_OMP_THREADS_BIND``), and a thread inherits the CPU mask of
the thread that starts it. Started from the worker, the save queue, the
checksum helpers and the layer-wise loader would all share that one core with
the model's main thread (measured here: a 48 MiB save's copies took 15-28 ms
instead of ~6). Every thread the connector starts first widens its own mask
to all CPUs; the kernel keeps it inside the process's cpuset.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["pool", "start", "unpin"]


def unpin() -> None:
    """Let the calling thread run on every CPU (Linux; elsewhere a no-op)."""
    setaffinity = getattr(os, "sched_setaffinity", None)
    if setaffinity is None:
        return
    with contextlib.suppress(OSError):  # a cpuset that refuses it: keep the inherited mask
        setaffinity(0, range(os.cpu_count() or 1))


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread that runs ``target`` unpinned."""

    def run() -> None:
        unpin()
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads run unpinned."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=unpin)
