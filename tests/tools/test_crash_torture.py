"""Crash torture in CI: kill -9 a real server under write load, restart, verify.

The loop itself is :mod:`kvstore.tools.torture` (``kvstore torture``
runs the long form); these are its bounded forms.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.tools import torture

pytestmark = pytest.mark.slow


def test_kill9_loop_loses_and_corrupts_nothing_reported_durable(tmp_path: Path) -> None:
    lines: list[str] = []
    res = torture.run(20, tmp_path, commit_every=2, log=lines.append)
    print("\n".join(lines))
    assert res.iterations == 20
    assert res.acknowledged > 0 and res.durable > 0, res.line()
    # every block reported durable was read back: none is excused (an orphan is lost)
    assert res.verified_reads >= res.durable, res.line()
    assert res.corrupt == 0 and res.phantom == 0 and res.lost == 0, res.line()


def test_kill9_loop_under_the_default_policy(tmp_path: Path) -> None:
    """The same under ``adaptive`` (the server's default policy: ``workload``'s bets,
    guarded): it writes back at once only what it values, the rest at the recovery point;
    a DISK report still means the block and its whole prefix are on disk."""
    lines: list[str] = []
    res = torture.run(8, tmp_path, commit_every=2, policy="adaptive", log=lines.append)
    print("\n".join(lines))
    assert res.iterations == 8
    assert res.acknowledged > 0 and res.durable > 0, res.line()
    assert res.verified_reads >= res.durable, res.line()
    assert res.corrupt == 0 and res.phantom == 0 and res.lost == 0, res.line()


def test_kill_in_the_middle_of_a_group_commit(tmp_path: Path) -> None:
    """SIGKILL while a server thread is inside the disk tier's commit (its pwrite or
    fdatasync, seen in /proc): every block reported durable is intact after the restart."""
    if not torture.commit_probe_works():
        pytest.skip("this host does not show thread syscalls in /proc/<pid>/task/*/syscall")
    t = torture.Torture(tmp_path, seed=1)
    try:
        for _ in range(4):
            t.run_iteration(commit_kill=True)
    finally:
        t.close()
    res = t.result
    assert len(res.commit_kills) == 4, res.line()  # each kill landed inside a commit
    assert res.durable > 0, res.line()
    assert res.verified_reads >= res.durable, res.line()
    assert res.corrupt == 0 and res.phantom == 0 and res.lost == 0, res.line()
