"""CURVE encryption and client authentication for the event sockets (optional).

With ``events.curve_secret_key_file`` set, the PUB and replay ROUTER sockets are
CURVE servers: traffic is encrypted, and only clients whose public key is in
``events.curve_client_keys_dir`` complete the handshake (a ZAP handler, pyzmq's
``ThreadAuthenticator``, checks each one). A subscriber without an accepted key
receives nothing. Keys are ZeroMQ certificate files, as
``zmq.auth.create_certificates(dir, name)`` writes them (``name.key`` holds the
public key, ``name.key_secret`` both); the server reads its ``.key_secret``, the
clients' ``.key`` files, and a client needs the server's public ``.key``. The
client directory is read at start: a new client needs a restart.

Errors reading keys are :class:`kvstore.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import os
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from kvstore.errors import ConfigError

__all__ = ["ZAP_DOMAIN", "CurveServer", "curve_client"]

#: The ZAP domain the event sockets announce.
ZAP_DOMAIN = b"kvstore-events"


def _load(path: str, what: str, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot read a ZeroMQ certificate from {path!r}: {exc}"
                          ) from exc
    if secret and not secret_key:
        raise ConfigError(f"{what}: {path!r} holds no secret key (use the .key_secret file)")
    return public, secret_key


class CurveServer:
    """The server side: keys applied to each socket, and the authenticator of a context."""

    def __init__(self, secret_key_file: str, client_keys_dir: str) -> None:
        public, secret = _load(secret_key_file, "events.curve_secret_key_file", secret=True)
        if not os.path.isdir(client_keys_dir):
            raise ConfigError(
                f"events.curve_client_keys_dir: {client_keys_dir!r} is not a directory")
        self.public_key = public
        self._secret_key = secret or b""
        self._clients_dir = client_keys_dir
        self._auth: ThreadAuthenticator | None = None

    def start(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        """Answer the handshakes of ``ctx``'s sockets (one authenticator per context)."""
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain=ZAP_DOMAIN.decode(), location=self._clients_dir)
        self._auth = auth

    def apply(self, sock: Any) -> None:
        """Make ``sock`` (a ``zmq.Socket`` or ``zmq.asyncio.Socket``) a CURVE server."""
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._secret_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SERVER, 1)

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def curve_client(sock: Any, server_key_file: str, client_secret_key_file: str) -> None:
    """Make ``sock`` (a SUB or REQ/DEALER of a subscriber) a CURVE client of the events."""
    server_public, _ = _load(server_key_file, "server key", secret=False)
    public, secret = _load(client_secret_key_file, "client key", secret=True)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret or b"")
