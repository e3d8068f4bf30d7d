"""The vLLM connector's pure parts, without vLLM: settings, namespaces,
sessions, payload checks, the fail-open link and block addressing."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from kvstore.connectors.vllm.config import ConnectorConfig, LayoutFingerprint, namespace_for
from kvstore.connectors.vllm.payload import (
    HEADER_SIZE,
    PayloadError,
    layout_digest,
    pack_header,
    unpack_body,
)
from kvstore.connectors.vllm.sessions import (
    SessionTracker,
    ToolCallMarkers,
    TurnInfo,
    finished_turn,
)

from kvstore.errors import ConfigError, InvalidBlock

# -- config and namespace -----------------------------------------------------------


def test_config_defaults_and_overrides() -> None:
    assert ConnectorConfig.from_extra_config(None) == ConnectorConfig()
    cfg = ConnectorConfig.from_extra_config({"address": "10.0.0.1:7000", "hold_max_ms": 500})
    assert cfg.address == "10.0.0.1:7000" and cfg.hold_max_ms == 500.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"adress": "x:1"}, "unknown key"),
        ({"timeout_s": "fast"}, "timeout_s"),
        ({"load": 1}, "load"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
        ({"address": "nohost"}, "host:port"),
        ({"default_workload": "gaming"}, "unknown workload"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(extra: dict[str, Any], message: str) -> None:
    with pytest.raises((ConfigError, InvalidBlock), match=message):
        ConnectorConfig.from_extra_config(extra)


FP = LayoutFingerprint(
    model="/models/tiny-llama",
    dtype="float32",
    num_layers=2,
    num_kv_heads=2,
    head_size=32,
    block_size=32,
    tp_rank=0,
    tp_size=1,
    device="cpu",
    hash_algo="sha256",
    tenant="default",
)


def test_namespace_is_readable_and_separates_every_layout_field() -> None:
    ns = namespace_for(FP)
    assert ns.startswith("vllm/default/tiny-llama/") and ns.endswith("/tp0of1")
    assert namespace_for(dataclasses.replace(FP)) == ns
    for field in dataclasses.fields(FP):
        value = getattr(FP, field.name)
        other = value + 1 if isinstance(value, int) else value + "x"
        changed = dataclasses.replace(FP, **{field.name: other})
        assert namespace_for(changed) != ns, field.name


# -- sessions -----------------------------------------------------------------------


def test_session_from_params() -> None:
    t = SessionTracker()
    turn = t.classify(
        {
            "session_id": "s1",
            "workload": "agent",
            "after": "tool_call",
            "tool": "search",
            "expected_gap_ms": 800,
        },
        [b"a" * 32],
    )
    assert (turn.session_id, turn.workload, turn.event, turn.tool, turn.expected_gap_ms) == (
        "s1",
        "agent",
        "tool_call",
        "search",
        800.0,
    )
    assert not turn.inferred
    assert t.classify({"session_id": "s1", "after": "end"}, []).event == "session_end"
    assert t.classify({"session_id": "s1", "after": "user"}, []).event == "turn_end"
    assert t.classify({"session_id": "s1", "workload": "gaming"}, []).workload == "unknown"


def test_cache_ttl_s_is_read_from_kv_transfer_params() -> None:
    t = SessionTracker()
    assert t.classify({"cache_ttl_s": 300}, []).cache_ttl_s == 300.0
    assert t.classify({"cache_ttl_s": 0.5}, []).cache_ttl_s == 0.5
    for bad in (-1, "300", True, float("nan"), float("inf"), None):
        assert t.classify({"cache_ttl_s": bad}, []).cache_ttl_s is None
    assert t.classify(None, []).cache_ttl_s is None


def test_session_inferred_from_prefix_chain() -> None:
    t = SessionTracker()
    h = [bytes([i]) * 32 for i in range(6)]
    first = t.classify(None, h[:2])
    assert first.inferred and first.session_id.startswith("auto-")
    t.turn_finished(first, h[:3])  # the turn's answer filled a third block
    nxt = t.classify({}, h[:5])  # the next turn resends the conversation
    assert nxt.session_id == first.session_id and nxt.inferred
    assert t.classify(None, [h[5]]).session_id != first.session_id
    # An explicit session keeps its workload and the next turn inherits it.
    named = t.classify({"session_id": "s9", "workload": "rag"}, [h[5]])
    t.turn_finished(named, [h[5]])
    assert t.classify({"session_id": "s9"}, [h[5], h[4]]).workload == "rag"


# -- payload --------------------------------------------------------------------------


def test_payload_roundtrip_and_every_refusal() -> None:
    import xxhash

    digest = layout_digest("ns", "layout")
    body = bytes(range(256)) * 4
    payload = pack_header(digest, b"h" * 32) + body
    checksum = xxhash.xxh3_64_intdigest(payload)  # the slot's, as the sidecar records it
    assert len(payload) == HEADER_SIZE + len(body)
    assert bytes(unpack_body(payload, digest, b"h" * 32, len(body), checksum)) == body
    with pytest.raises(PayloadError, match="namespace or KV layout"):
        unpack_body(payload, layout_digest("ns2", "layout"), b"h" * 32, len(body), checksum)
    with pytest.raises(PayloadError, match="another block hash"):
        unpack_body(payload, digest, b"g" * 32, len(body), checksum)
    for at in (len(payload) - 1, 20, 60):  # the body, a reserved header byte, the old sum
        corrupted = bytearray(payload)
        corrupted[at] ^= 1
        with pytest.raises(PayloadError, match="checksum"):
            unpack_body(corrupted, digest, b"h" * 32, len(body), checksum)
    with pytest.raises(PayloadError, match="bytes, expected"):
        unpack_body(payload[:-1], digest, b"h" * 32, len(body), checksum)
    with pytest.raises(PayloadError, match="not a connector payload"):
        unpack_body(b"\0" * len(payload), digest, b"h" * 32, len(body), None)


# -- block addressing in any KV layout ------------------------------------------------


def test_layout_gathers_and_scatters_cpu_and_flash_layouts() -> None:
    torch = pytest.importorskip("torch")
    from kvstore.connectors.vllm.layout import KVLayout

    torch.manual_seed(0)
    nb = 10

    def caches() -> dict[str, Any]:
        return {
            # vLLM 0.32 standardized [B, H, N, C] view, head-major physical layout
            "cpu": torch.randn(nb, 2, 32, 64),
            # the same logical view over a permuted (strided) allocation
            "strided": torch.randn(2, 32, nb, 64).permute(2, 0, 1, 3),
            # FlashAttention [2, B, block, H, D] with two kernel blocks per block
            "flash": torch.randn(2, 2 * nb, 16, 2, 32),
        }

    src, dst = caches(), {k: torch.zeros_like(v) for k, v in caches().items()}
    dst["strided"] = torch.zeros(2, 32, nb, 64).permute(2, 0, 1, 3)
    src["shared"] = src["cpu"]  # cross-layer sharing: stored once
    a, b = KVLayout(src, nb), KVLayout(dst, nb)
    assert len(a.layers) == 3 and a.block_bytes == b.block_bytes
    assert a.signature == b.signature
    ids = [3, 7, 1]
    b.scatter(ids, a.gather(ids))
    for name in ("cpu", "strided"):
        assert torch.equal(src[name][ids], dst[name][ids])
        assert dst[name][[0, 2]].abs().sum() == 0
    kernel = [6, 7, 14, 15, 2, 3]
    assert torch.equal(src["flash"][:, kernel], dst["flash"][:, kernel])
    assert dst["flash"][:, [0, 1]].abs().sum() == 0


def test_layout_refuses_tensors_without_a_block_axis() -> None:
    torch = pytest.importorskip("torch")
    from kvstore.connectors.vllm.layout import KVLayout, LayoutError, find_block_axis

    assert find_block_axis((2, 20, 16), 10) == (1, 2)
    assert find_block_axis((10, 4), 10) == (0, 1)
    with pytest.raises(LayoutError, match="no block axis"):
        KVLayout({"x": torch.zeros(3, 7)}, 10)


# -- turn ends from what the engine saw ----------------------------------------------


def test_tool_call_markers_from_extra_config() -> None:
    cfg = ConnectorConfig.from_extra_config({
        "tool_call_stop_token_ids": [128008],
        "tool_call_token_sequences": [[524, 14506, 13735, 29]],
        "lookup_max_age_s": 0.5,
    })
    markers = cfg.tool_call_markers()
    assert markers.stop_token_ids == {128008}
    assert markers.sequences == ((524, 14506, 13735, 29),)
    assert cfg.lookup_max_age_s == 0.5
    assert not ConnectorConfig().tool_call_markers()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tool_call_stop_token_ids": 128008}, "must be a list of token ids"),
        ({"tool_call_stop_token_ids": ["<|eom_id|>"]}, "got the item '<|eom_id|>'"),
        ({"tool_call_stop_token_ids": [-1]}, "got the item -1"),
        ({"tool_call_token_sequences": [1, 2]}, "non-empty lists of token ids"),
        ({"tool_call_token_sequences": [[]]}, "got the item []"),
        ({"lookup_max_age_s": -1}, "lookup_max_age_s must be >= 0"),
    ],
)
def test_marker_keys_refuse_bad_values_naming_the_key(extra: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ConnectorConfig.from_extra_config(extra)


def _turn(after: str | None, **extra: Any) -> TurnInfo:
    params = {"session_id": "s", "tool": "grep", "expected_gap_ms": 300, **extra}
    if after is not None:
        params["after"] = after
    return SessionTracker().classify(params, [b"\x01" * 32])


MARKERS = ToolCallMarkers(frozenset({77}), ((5, 6, 7),))


@pytest.mark.parametrize(
    ("after", "stopped", "reason", "output", "event", "source"),
    [
        ("user", True, 77, [1, 77], "tool_call", "stop_token"),
        (None, True, None, [3, 77], "tool_call", "stop_token"),  # an EOS-listed marker
        (None, False, None, [5, 6, 7, 8], "tool_call", "token_sequence"),
        ("tool_call", True, None, [1, 2], "turn_end", "stop"),
        ("tool_call", False, None, [1, 2], "tool_call", "params"),  # capped: unknown
        ("end", True, 77, [77], "session_end", "params"),
        (None, True, None, [5, 6, 2, 7], "turn_end", "default"),
        (None, False, 77, [], "turn_end", "default"),  # not stopped: no stop token seen
    ],
)
def test_finished_turn_follows_the_stop_and_the_markers(
    after: str | None, stopped: bool, reason: object, output: list[int], event: str,
    source: str,
) -> None:
    turn, got = finished_turn(_turn(after), MARKERS, stopped=stopped, stop_reason=reason,
                              output_token_ids=output)
    assert (turn.event, got) == (event, source)
    changed = turn.event != _turn(after).event
    assert (turn.tool, turn.expected_gap_ms) == ((None, None) if changed else ("grep", 300))


def test_finished_turn_without_markers_keeps_the_claim() -> None:
    turn = _turn("tool_call")
    assert finished_turn(turn, ToolCallMarkers(), stopped=True, stop_reason=77,
                         output_token_ids=[77]) == (turn, "params")
