"""A real kvstore sidecar as a subprocess: start, kill, restart on the same port.

The tools' one harness (:class:`kvstore.tools.harness.LocalServer`, standard library only
at import) with the vLLM scenarios' defaults, so both the main venv's pytest and the vLLM
venv's scenario scripts use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvstore.tools.harness import LocalServer, free_port

__all__ = ["Sidecar", "free_port"]


class Sidecar(LocalServer):
    """``kvstore serve`` on loopback, with its log in ``data_dir/../sidecar-<port>.log``.

    ``kvstore_bin`` is the ``kvstore`` executable, or a command that runs it
    (``[sys.executable, "-m", "kvstore.cli"]``). Ready once the port accepts (a sidecar
    with tenants refuses an anonymous Stats); none of this process's ``VLLM_*``,
    ``KVSTORE_VLLM*`` or ``KVSTORE_BIN`` variables reach it (``KVSTORE_*`` configure the
    server). The event sockets take OS-chosen loopback ports unless ``config`` has an
    ``events`` section."""

    def __init__(
        self,
        kvstore_bin: str | Sequence[str],
        data_dir: Path,
        port: int | None = None,
        config: dict[str, dict[str, str | int | float | bool]] | None = None,
    ) -> None:
        port = port or free_port()
        super().__init__(
            data_dir, port=port, config=config, command=kvstore_bin, ready="tcp",
            # OS-chosen event ports unless the scenario sets its own (two sidecars on one
            # machine, or a sidecar next to a running service, must not fight over :5557)
            loopback_events=not (config and "events" in config),
            drop_env=("VLLM_", "KVSTORE_VLLM", "KVSTORE_BIN"),
            log_path=Path(data_dir).parent / f"sidecar-{port}.log",
        )

    def start(self, timeout: float = 60.0) -> Sidecar:
        super().start(timeout)
        return self

    def kill(self) -> None:
        """SIGKILL: the sidecar dies without any goodbye, as in a crash."""
        self.kill9()
        self.proc = None

    def stop(self, timeout: float = 20.0) -> None:
        super().stop(timeout)
        self.proc = None
