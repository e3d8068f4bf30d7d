"""A real kvstore sidecar as a subprocess: start, kill, restart on the same port.

Standard library only, so both the main venv's pytest and the vLLM venv's
scenario scripts use it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Sidecar", "free_port"]


def _to_toml(sections: dict[str, dict[str, str | int | float | bool]]) -> str:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, str):
                lines.append(f'{key} = "{value}"')
            else:
                lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sidecar:
    """``kvstore serve`` on loopback, with its log in ``data_dir/../<name>.log``.

    ``kvstore_bin`` is the ``kvstore`` executable, or a command that runs it
    (``[sys.executable, "-m", "kvstore.cli"]``)."""

    def __init__(
        self,
        kvstore_bin: str | Sequence[str],
        data_dir: Path,
        port: int | None = None,
        config: dict[str, dict[str, str | int | float | bool]] | None = None,
    ) -> None:
        self.kvstore_bin = kvstore_bin
        self.config = config
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"sidecar-{self.port}.log"

    def start(self, timeout_s: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        prefix = [self.kvstore_bin] if isinstance(self.kvstore_bin, str) else list(self.kvstore_bin)
        cmd = [
            *prefix,
            "serve",
            "--listen",
            self.address,
            "--data-dir",
            str(self.data_dir),
            "--metrics-port",
            "0",
        ]
        if self.config:
            toml = self.data_dir.parent / f"sidecar-{self.port}.toml"
            toml.write_text(_to_toml(self.config))
            cmd += ["--config", str(toml)]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        # KVSTORE_* variables configure the server: pass none of the test's own.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VLLM_", "KVSTORE_VLLM", "KVSTORE_BIN"))
        }
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"kvstore serve exited with {self.proc.returncode}; "
                    f"log:\n{self.log_path.read_text()[-3000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"kvstore serve did not listen on {self.address} in {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL: the sidecar dies without any goodbye, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the sidecar still accepts connections but never answers (slow)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> Sidecar:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
