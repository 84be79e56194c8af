"""The model's shape, read from GGUF metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.model.architecture import ARCHITECTURES, Architecture


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
    sliding_window: int = 0  # positions a sliding layer attends to (Architecture.swa_period says which layers)
    # Llama 3's RoPE scaling: each RoPE pair's frequency at rope_theta divided by its factor (head_dim / 2 of
    # them; llama.cpp's converter stores them as the `rope_freqs` tensor); empty: none
    rope_freq_factors: tuple[float, ...] = ()

    @property
    def arch(self) -> Architecture:
        return ARCHITECTURES[self.architecture]

    def layer_window(self, layer: int) -> int:
        """Positions layer `layer` attends to, back from the query's own: 0 for the whole context."""
        period = self.arch.swa_period
        return self.sliding_window if period and self.sliding_window and (layer + 1) % period else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.arch.local_rope_base if self.layer_window(layer) else self.rope_theta

    def rope_bases(self) -> dict[float, tuple[float, ...]]:
        """Each RoPE base a table is built for, with its frequency factors: the layers' bases and the global one
        (even where every layer slides: the fused C step takes its table as the step's first); the factors
        (Llama 3's) belong to the global base alone."""
        bases = {self.rope_theta} | {self.layer_rope_base(i) for i in range(self.num_layers)}
        return {base: self.rope_freq_factors if base == self.rope_theta else () for base in bases}

    @property
    def features(self) -> tuple[str, ...]:
        """The architecture's features and the model's own beyond Llama's layer, in words (for refusals)."""
        return self.arch.features + (("RoPE frequency factors",) if self.rope_freq_factors else ())

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


def config_from_metadata(meta: dict[str, Any], source: str, rope_freqs: Sequence[float] = ()) -> ModelConfig:
    """Build a ModelConfig from GGUF key/values (and the file's `rope_freqs` tensor, if any); unsupported
    architectures are refused by name."""
    arch = str(meta.get("general.architecture", "?"))
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{source}: unsupported architecture '{arch}' (supported: {', '.join(ARCHITECTURES)})")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{source}: GGUF metadata lacks '{arch}.{key}'")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", get("rope.dimension_count", hidden // heads)))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ModelLoadError(f"{source}: keys and values of different widths are not supported")
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
        sliding_window=int(get("attention.sliding_window", 0)) if ARCHITECTURES[arch].swa_period else 0,
        rope_freq_factors=_rope_factors(rope_freqs, head_dim, source),
    )


def _rope_factors(factors: Sequence[float], head_dim: int, source: str) -> tuple[float, ...]:
    if len(factors) not in (0, head_dim // 2):
        raise ModelLoadError(f"{source}: rope_freqs has {len(factors)} factors, not head_dim / 2 = {head_dim // 2}")
    return tuple(float(f) for f in factors)


def _eos_ids(meta: dict[str, Any]) -> tuple[int, ...]:
    ids = [int(meta["tokenizer.ggml.eos_token_id"])] if "tokenizer.ggml.eos_token_id" in meta else []
    if "tokenizer.ggml.eot_token_id" in meta:
        ids.append(int(meta["tokenizer.ggml.eot_token_id"]))
    return tuple(dict.fromkeys(ids))
