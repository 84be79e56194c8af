"""The model's shape, read from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama",)


class ModelLoadError(Exception):
    """A model file that cannot be served; the message is one line meant for the user."""


@dataclass(frozen=True)
class ModelConfig:
    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab_size: int
    context_length: int
    bos_token_id: int
    eos_token_ids: tuple[int, ...]

    @property
    def kv_group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_width(self) -> int:
        """Columns of the fused Q/K/V projection's output."""
        return self.q_size + 2 * self.kv_size


def config_from_metadata(meta: dict[str, Any], source: str) -> ModelConfig:
    """Build a ModelConfig from GGUF key/values; unsupported architectures are refused by name."""
    arch = str(meta.get("general.architecture", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{source}: unsupported architecture '{arch}' (supported: llama)")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{source}: GGUF metadata lacks '{arch}.{key}'")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("rope.dimension_count", hidden // heads))
    return ModelConfig(
        name=str(meta.get("general.name", source)),
        architecture=arch,
        num_layers=int(get("block_count")),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        vocab_size=int(get("vocab_size", len(meta.get("tokenizer.ggml.tokens", ())))),
        context_length=int(get("context_length")),
        bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        eos_token_ids=_eos_ids(meta),
    )


def _eos_ids(meta: dict[str, Any]) -> tuple[int, ...]:
    ids = [int(meta["tokenizer.ggml.eos_token_id"])] if "tokenizer.ggml.eos_token_id" in meta else []
    if "tokenizer.ggml.eot_token_id" in meta:
        ids.append(int(meta["tokenizer.ggml.eot_token_id"]))
    return tuple(dict.fromkeys(ids))
