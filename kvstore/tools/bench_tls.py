"""``kvstore bench --tls``: gRPC put / get GB/s over TLS next to plaintext, same run.

Starts two local servers (DRAM only), one plaintext and one with a certificate that
a throwaway CA made with ``openssl`` signed, and measures the gRPC streaming path
(the one remote clients use; shared memory never crosses TLS) against each in turn,
alternating rounds so both see the same machine load. Prints GB/s and TLS / plain,
and what checking a bearer token costs a call: Lookup latency of 1,000 hashes against
a third server with tenants, next to the plaintext one.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from kvstore.tools.harness import dram_only_server
from kvstore.tools.measure import make_blocks, measure

__all__ = ["make_certificates", "print_results", "run"]

_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def make_certificates(where: Path) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1 / localhost: (ca, cert, key) paths."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=kvstore-bench-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", *_EC, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (where / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "server.ext")
    return str(where / "ca.crt"), str(where / "server.crt"), str(where / "server.key")


def run(total_bytes: int, repeats: int) -> dict[str, Any]:
    from kvstore.security.client import ClientSecurity

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-tls-") as tmp:
        ca, cert, key = make_certificates(Path(tmp))
        tls = ClientSecurity(tls=True, ca_file=ca)
        plain = ClientSecurity()
        dram = f"{max(512, total_bytes * 3 // 2**20)}MiB"
        tls_env = {"KVSTORE_TLS__CERT_FILE": cert, "KVSTORE_TLS__KEY_FILE": key}
        tenants = Path(tmp, "tenants.toml")
        tenants.write_text('[[tenants]]\nname = "bench"\ntoken = "bench-token"\n'
                           'namespaces = ["*"]\nrights = ["read", "write", "admin"]\n')
        token = ClientSecurity(token="bench-token")
        with dram_only_server(dram, security=plain) as plain_addr, \
                dram_only_server(dram, tls_env, security=tls) as tls_addr, \
                dram_only_server("64MiB", {"KVSTORE_AUTH__TENANTS_FILE": str(tenants)},
                        security=token) as token_addr:
            lookup = _lookup_ms(plain_addr, plain, token_addr, token)
            for size in (2**20, 64 * 2**10):
                n = max(16, total_bytes // size)
                best: dict[str, dict[str, float]] = {"plain": {}, "tls": {}}
                for _ in range(repeats):  # alternating: both see the same load
                    for mode, addr, sec in (("plain", plain_addr, plain), ("tls", tls_addr, tls)):
                        for op, s in measure(addr, "grpc", size, n, 1, security=sec).items():
                            best[mode][op] = min(best[mode].get(op, s), s)
                row: dict[str, Any] = {"block": size, "blocks": n}
                for op in best["plain"]:
                    p_gbps = n * size / best["plain"][op] / 1e9
                    t_gbps = n * size / best["tls"][op] / 1e9
                    row[op] = {"plain_gbps": round(p_gbps, 3), "tls_gbps": round(t_gbps, 3),
                               "tls_vs_plain": round(t_gbps / p_gbps, 3)}
                rows.append(row)
    return {"rows": rows, "repeats": repeats, "bytes_per_run": total_bytes,
            "lookup_1000_p50_ms": lookup}


def _lookup_ms(plain_addr: str, plain: Any, token_addr: str, token: Any) -> dict[str, float]:
    """p50 of 1,000-hash Lookups without and with a token, rounds alternating."""
    from kvstore.client import KVStoreClient

    blocks = make_blocks(1000, 256, seed=4)
    hashes = [b.block_hash for b in blocks]
    lat: dict[str, list[float]] = {"plain": [], "token": []}
    with KVStoreClient(plain_addr, security=plain, shared_memory=False) as p, \
            KVStoreClient(token_addr, security=token, shared_memory=False) as t:
        clients = {"plain": p, "token": t}
        for c in clients.values():
            c.put("bench-lookup", blocks)
        for _ in range(300):
            for mode, c in clients.items():
                t0 = time.perf_counter()
                if c.lookup("bench-lookup", hashes).num_hit != 1000:
                    raise RuntimeError(f"{mode}: lookup missed stored blocks")
                lat[mode].append(time.perf_counter() - t0)
    out = {mode: round(statistics.median(v) * 1e3, 3) for mode, v in lat.items()}
    out["token_vs_plain"] = round(out["token"] / out["plain"], 3)
    return out


def print_results(results: dict[str, Any]) -> None:
    print(f"{'block':>8} {'op':>8} | {'plain':>7} {'tls':>7} GB/s | tls/plain")
    for r in results["rows"]:
        blk = f"{r['block'] // 1024} KiB" if r["block"] < 2**20 else f"{r['block'] // 2**20} MiB"
        for op in ("put", "get", "get_into"):
            x = r[op]
            print(f"{blk:>8} {op:>8} | {x['plain_gbps']:>7.3f} {x['tls_gbps']:>7.3f}      | "
                  f"{x['tls_vs_plain']:>8.1%}")
    lk = results["lookup_1000_p50_ms"]
    print(f"lookup of 1,000 hashes, p50: {lk['plain']:.3f} ms plain, {lk['token']:.3f} ms with a "
          f"bearer token checked ({lk['token_vs_plain']:.2f}x)")
