"""Who may call the server, and what each caller may touch.

- :mod:`kvstore.security.grants`: tenants, their namespaces and rights (pure);
- :mod:`kvstore.security.config`: the ``[auth]`` and ``[tls]`` config sections;
- :mod:`kvstore.security.server`: TLS credentials and the interceptor that
  authenticates and authorizes every call;
- :mod:`kvstore.security.client`: what clients send (token, TLS), from arguments or
  the environment (``KVSTORE_TOKEN``, ``KVSTORE_TLS_CA``, ...).

Nothing here is imported by the engine; grpc is imported only by ``server`` and
``client``.
"""
