"""Block hashing is bit-for-bit vLLM's (vectors produced by vLLM 0.32's own
``hash_block_tokens`` with ``PYTHONHASHSEED=0``; a live cross-check runs when
the vllm venv is there)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kvstore.hashing import (
    PrefixHasher,
    block_hash_to_int,
    hash_block_tokens,
    none_hash,
    sha256_cbor,
    xxhash_cbor,
)

TOKENS = list(range(100, 164))  # 4 blocks of 16

SHA_PLAIN = [
        "ab58392d264a768c3517f3993e9d629300c57835c145dd6e75876fa1c1a52a9c",
        "cd7899503ba3829377063fdc1ac124a7c8b79a39b66137a14e8a52dc92849429",
        "fa7257ce210f83f6b9aa1d458fff265a81c5082e8b56f6c4b6b3a47b4e5094ca",
        "8719e6adb295649f5146ae8fe67cba6867596fc7baa8aa8c4098906c4a017387",
    ]
SHA_SALTED = [
        "7d7b2e39029a7e7cb40e31d35ba84a0329ce5b89b59ce982fd20ca03e82bb0a7",
        "8f11d0ff110478a39613cdb02a15a838b91a6a820207ff38cbf3240585808b07",
        "85956773a1136b59155b7695160b559d7ea3b78b726723d09e11736f12ebbcdf",
        "db4646e8801b5804a256ec67d07a6915f43d7f4ddbb161d85f4797b9908dddc8",
    ]
XX_PLAIN = [
        "44a6e932beab462055ecfc98f7017242",
        "7c7a0cc60b1a8036416025b3d503dc04",
        "3c37ffc4f519b5d20388a6466338fc58",
        "415169e052454d1dba7035567c0ed063",
    ]
XX_SALTED = [
        "8dbc423f03609078e5b1cbf8d9724c63",
        "02b646e93e63c8a3e0f5b0f11b647912",
        "3d6554f477f299e3a82f63695aff7c98",
        "60be2ec5f152288701ae9e3fcfea2b00",
    ]
SHA_INT64 = [8468860364822751900, 5659426989048894505, 13165046985235928266, 4654629009659884423]
#: Block 0 of tokens 0..15 with vLLM's default seed (PYTHONHASHSEED unset, sha256).
SHA_DEFAULT_SEED_BLOCK0 = "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749"


@pytest.mark.parametrize(("fn", "plain", "salted"), [
    ("sha256_cbor", SHA_PLAIN, SHA_SALTED),
    ("xxhash_cbor", XX_PLAIN, XX_SALTED),
])
def test_chain_matches_vllm(fn, plain, salted):
    h = PrefixHasher(16, fn, seed="0")
    assert [x.hex() for x in h.hashes(TOKENS)] == plain
    # cache_salt enters block 0 only, yet changes every hash after it (chaining)
    assert [x.hex() for x in h.hashes(TOKENS, cache_salt="tenant-a")] == salted
    assert len(h.hashes(TOKENS)[0]) == (32 if fn == "sha256_cbor" else 16)


def test_partial_blocks_are_not_hashed():
    assert len(PrefixHasher(16, seed="0").hashes(TOKENS[:63])) == 3


def test_default_seed_matches_vllm():
    assert hash_block_tokens("sha256_cbor", None, list(range(16))).hex() == SHA_DEFAULT_SEED_BLOCK0


def test_single_block_api_and_none_hash():
    parent = hash_block_tokens("sha256_cbor", None, TOKENS[:16], seed="0")
    assert parent.hex() == SHA_PLAIN[0]
    assert hash_block_tokens("sha256_cbor", parent, TOKENS[16:32], seed="0").hex() == SHA_PLAIN[1]
    assert none_hash("sha256_cbor", "0") == sha256_cbor("0")
    assert none_hash("xxhash_cbor", "0") == xxhash_cbor("0")


def test_int64_form_is_low_64_bits():
    hashes = PrefixHasher(16, seed="0").hashes(TOKENS)
    assert [block_hash_to_int(h) for h in hashes] == SHA_INT64
    assert all(0 <= block_hash_to_int(h) < 2**64 for h in hashes)


def test_unknown_hash_function_is_refused():
    with pytest.raises(ValueError, match="valid: sha256_cbor, xxhash_cbor"):
        PrefixHasher(16, "md5")


LIVE = """
import json, sys
from vllm.utils.hashing import sha256_cbor, xxhash_cbor
from vllm.v1.core import kv_cache_utils as k
toks = json.loads(sys.argv[1]); out = {}
for name, fn in (("sha256_cbor", sha256_cbor), ("xxhash_cbor", xxhash_cbor)):
    k.init_none_hash(fn); p = None; hs = []
    for i in range(len(toks) // 32):
        p = k.hash_block_tokens(fn, p, toks[i*32:(i+1)*32], (("lora", "a", "/p"),))
        hs.append(bytes(p).hex())
    out[name] = hs
print(json.dumps(out))
"""


def test_live_against_vllm(vllm_python):
    import random

    toks = [random.randrange(50_000) for _ in range(32 * 5)]
    env = {**os.environ, "PYTHONHASHSEED": "1234"}
    out = subprocess.run([vllm_python, "-c", LIVE, json.dumps(toks)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    for fn in ("sha256_cbor", "xxhash_cbor"):
        ours = PrefixHasher(32, fn, seed="1234").hashes(toks, lora=("a", "/p"))
        assert [h.hex() for h in ours] == theirs[fn]
