"""Hardware profiles for the simulated backend: what a step costs on a given machine.

Nominal figures are datasheet (GPUs) or measured (this CPU) peaks; the efficiency factors scale them to what
a real inference step achieves, because no kernel streams at the full HBM bandwidth or runs at the dense
tensor-core peak. `overhead_s` is the fixed host-side cost of one step (kernel launches, host<->device
copies, the sampling sync), paid however small the batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from backends.model.config import ModelConfig


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    bandwidth: float  # bytes/s, nominal memory bandwidth
    peak_flops: float  # FLOP/s, nominal dense peak at the profile's dtype
    dtype_bytes: int  # bytes per weight and per KV element
    bandwidth_efficiency: float = 1.0
    flops_efficiency: float = 1.0
    overhead_s: float = 0.0

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.bandwidth_efficiency

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.flops_efficiency

    @property
    def is_free(self) -> bool:
        """True for the zero profile: every step costs nothing."""
        return math.isinf(self.bandwidth) and math.isinf(self.peak_flops) and self.overhead_s == 0


PROFILES: dict[str, HardwareProfile] = {
    # Infinite bandwidth and FLOPs, no overhead: instant steps (scheduler micro-benchmarks, service tests).
    "zero": HardwareProfile("zero", math.inf, math.inf, dtype_bytes=2),
    # This 2-vCPU machine running the NumPy float32 model (its fused C decode step up to 64 rows, OpenBLAS sgemm
    # for prefill). Measured (docs/PERFORMANCE.md): copy bandwidth 24-28 GB/s (32-36 on a quieter day), read
    # bandwidth 31 GB/s, two cores' FMA peak 233 GFLOP/s (116 each); the model's decode step 20-22 ms at
    # batch 1, 26-29 at 8, 68-75 at 32, 127-148 at 64 (256 context), prefill 450-590 tokens/s. With 90 % of
    # 32 GB/s, 58 % of the FMA peak and 1 ms of Python per step, this roofline gives 20, 23, 69 and 137 ms and
    # 590 tokens/s: right from batch 1 to 64 and for prefill (586 tokens/s at 512 with the chunk attention
    # kernel), but 15 % under at batch 8, where a real step is neither purely memory- nor compute-bound.
    "cpu": HardwareProfile("cpu", 32e9, 233e9, dtype_bytes=4, bandwidth_efficiency=0.9, flops_efficiency=0.58,
                           overhead_s=1e-3),
    # A100 SXM 80 GB: 2.0 TB/s HBM2e, 312 TFLOP/s dense bf16. Decode kernels reach ~80 % of HBM bandwidth and
    # large GEMMs ~60 % of peak; ~1.5 ms per step of launches and copies without CUDA graphs.
    "a100": HardwareProfile("a100", 2.0e12, 312e12, dtype_bytes=2, bandwidth_efficiency=0.8,
                            flops_efficiency=0.6, overhead_s=1.5e-3),
    # H100 SXM: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16; same efficiencies, a faster host side.
    "h100": HardwareProfile("h100", 3.35e12, 989e12, dtype_bytes=2, bandwidth_efficiency=0.8,
                            flops_efficiency=0.6, overhead_s=1.2e-3),
    # H200 SXM: the H100's compute with 4.8 TB/s HBM3e.
    "h200": HardwareProfile("h200", 4.8e12, 989e12, dtype_bytes=2, bandwidth_efficiency=0.8,
                            flops_efficiency=0.6, overhead_s=1.2e-3),
}


def get_profile(name: str) -> HardwareProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown sim profile '{name}' (choose from {', '.join(PROFILES)})")
    return PROFILES[name]


# Model shapes the simulator can cost instead of the served model's (its tokenizer still draws the tokens):
# capacity planning for a bigger model on a GPU, without its weights. Sizes from the models' published configs.
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "llama-3.2-1b": {"num_layers": 16, "hidden_size": 2048, "intermediate_size": 8192, "num_heads": 32,
                     "num_kv_heads": 8, "head_dim": 64, "vocab_size": 128256},
    "llama-3-8b": {"num_layers": 32, "hidden_size": 4096, "intermediate_size": 14336, "num_heads": 32,
                   "num_kv_heads": 8, "head_dim": 128, "vocab_size": 128256},
}


def shaped(config: ModelConfig, shape: str) -> ModelConfig:
    """`config` with the sizes of the named model shape ("" keeps the served model's)."""
    if not shape:
        return config
    if shape not in MODEL_SHAPES:
        raise ValueError(f"unknown sim model shape '{shape}' (choose from {', '.join(MODEL_SHAPES)})")
    sizes = MODEL_SHAPES[shape]
    return dataclasses.replace(
        config, name=shape, num_layers=sizes["num_layers"], hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"], num_heads=sizes["num_heads"],
        num_kv_heads=sizes["num_kv_heads"], head_dim=sizes["head_dim"], vocab_size=sizes["vocab_size"])
