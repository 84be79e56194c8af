"""What differs between the decoder-only families pagedserve serves, as data.

One `Architecture` per family, named as GGUF's `general.architecture` names it. The config reads the family's
metadata through it, both formats' loaders the tensors it lists (`layer_tensors`), and every forward pass
computes what it says: no forward pass branches on a family's name. Adding a family is adding an entry to
ARCHITECTURES (and its tests: docs/DESIGN.md, "Adding an architecture"); a backend that cannot compute one of
its features refuses the model at start-up (`unsupported_by`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RopePairs = Literal["interleaved", "halves"]
Activation = Literal["silu", "gelu_tanh"]
# A Llama layer's tensors, by GGUF's names after `blk.N.`; an Architecture's features add to them (layer_tensors)
LLAMA_LAYER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class Architecture:
    name: str
    # Which head dimensions RoPE rotates together: "interleaved" (2i, 2i + 1), the layout llama.cpp's converter
    # gives Llama's Q and K rows; "halves" (i, i + head_dim / 2), NeoX's, which Gemma's rows keep.
    rope_pairs: RopePairs = "interleaved"
    activation: Activation = "silu"  # of the gate in gate * up: SwiGLU (silu) or GeGLU (tanh-approximated GELU)
    scale_embeddings: bool = False  # embeddings times sqrt(hidden) (Gemma; in float32)
    qk_norm: bool = False  # an RMSNorm over each Q and K head, before RoPE
    qkv_bias: bool = False  # a bias vector added after each of the Q, K and V projections (Qwen2)
    sandwich_norms: bool = False  # an RMSNorm after attention and after the MLP too, before each residual add
    # Every swa_period-th layer (1-based) attends to the whole context, the others to the last
    # `sliding_window` positions (the metadata's); 0: every layer attends to the whole context.
    swa_period: int = 0
    local_rope_base: float = 10_000.0  # RoPE base of the sliding layers

    @property
    def features(self) -> tuple[str, ...]:
        """What this family computes beyond Llama's layer, in words (for refusals)."""
        named = {"RoPE over head halves": self.rope_pairs == "halves", "GeGLU": self.activation == "gelu_tanh",
                 "scaled embeddings": self.scale_embeddings, "QK norm": self.qk_norm, "QKV biases": self.qkv_bias,
                 "norms after attention and MLP": self.sandwich_norms, "sliding-window layers": self.swa_period > 0}
        return tuple(name for name, present in named.items() if present)

    @property
    def layer_tensors(self) -> tuple[str, ...]:
        """The tensors a layer of this family has, as `blk.N.<name>` in a GGUF file: its weights, then its
        biases. The weight loader loads these, and a checkpoint is checked against them."""
        weights = (*LLAMA_LAYER, *(("attn_q_norm", "attn_k_norm") if self.qk_norm else ()),
                   *(("post_attention_norm", "post_ffw_norm") if self.sandwich_norms else ()))
        biases = ("attn_q", "attn_k", "attn_v") if self.qkv_bias else ()
        return (*(f"{w}.weight" for w in weights), *(f"{b}.bias" for b in biases))


# Llama 3's RoPE scaling, Qwen3's head_dim apart from hidden / heads and untied output heads are the model's, not
# its family's: the config's rope_freq_factors and head_dim, the weights' lm_head. Mistral is "llama": its GGUF
# files say so (llama.cpp's converter), and its layer is Llama's.
ARCHITECTURES = {
    "llama": Architecture("llama"),
    # Qwen2 and Qwen3 keep NeoX's RoPE layout (llama.cpp's converter does not permute their Q and K rows)
    "qwen2": Architecture("qwen2", rope_pairs="halves", qkv_bias=True),
    "qwen3": Architecture("qwen3", rope_pairs="halves", qk_norm=True),
    # Gemma 3: the GGUF's norm weights already hold Gemma's (1 + weight), as llama.cpp's converter writes them.
    "gemma3": Architecture("gemma3", rope_pairs="halves", activation="gelu_tanh", scale_embeddings=True,
                           qk_norm=True, sandwich_norms=True, swa_period=6),
}


def unsupported_by(arch: Architecture, supported: frozenset[str]) -> tuple[str, ...]:
    """The features of `arch` outside `supported` (a backend's set of `features` names)."""
    return tuple(f for f in arch.features if f not in supported)
