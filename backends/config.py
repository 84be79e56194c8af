"""The backends package's configuration."""

from __future__ import annotations

from dataclasses import dataclass

from backends.numpy_backend.native.cpu_tiers import CHOICES as CPU_ISAS

BACKEND_NAMES = ("numpy", "cupy", "sim")
CPU_KERNELS = ("auto", "native", "numpy")
WEIGHTS = ("gguf", "float32")
CPU_PRECISIONS = ("exact", "fast")
KV_CACHE_DTYPES = ("float32", "float16")
CUDA_GRAPH_MODES = ("eager", "lazy", "off")  # backends/cupy_backend/graphs.py checks the same


@dataclass(frozen=True)
class BackendConfig:
    name: str = "numpy"
    model: str | None = None  # a GGUF path; None: the default model package's file
    chat_template: str | None = None  # a Jinja file replacing the model's chat template (or giving it one)
    dtype: str = "float32"  # cupy only: float32 | float16 | bfloat16
    sim_profile: str = "zero"  # sim only: zero | cpu | a100 | h100 | h200
    sim_clock: str = "real"  # sim only: real (sleeps) | virtual (advances a counter)
    sim_seed: int = 0
    sim_model: str = ""  # sim only: cost a model of this shape (llama-3.2-1b | llama-3-8b); "": the served one
    sim_faults: str = ""  # sim only: injected failures, e.g. "step_error@3,bad_token%5" (sim_backend/faults.py)
    cpu_kernels: str = "auto"  # numpy only: auto (C kernels, NumPy if no compiler) | native | numpy
    weights: str = "gguf"  # gguf: each matrix as the file stores it (where a kernel reads its type) | float32
    cpu_precision: str = "exact"  # numpy only: exact (float32 arithmetic) | fast (bfloat16 products, batches)
    kv_cache_dtype: str = "float32"  # numpy only: float32 | float16 (half the KV bytes; cupy's cache is in dtype)
    cpu_isa: str = "auto"  # numpy only: the CPU tier the C kernels are built for; auto: the highest this CPU runs
    # cupy only: decode steps as CUDA graph replays, captured at start-up (eager) or at a bucket's first step (lazy)
    cuda_graphs: str = "eager"
    cuda_graph_max_batch: int = 256  # cupy only: the largest decode batch replayed from a graph

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"backend dtype must be float32, float16 or bfloat16, not {self.dtype!r}")
        if self.cpu_kernels not in CPU_KERNELS:
            raise ValueError(f"cpu_kernels must be one of {CPU_KERNELS}, not {self.cpu_kernels!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, not {self.weights!r}")
        if self.cpu_precision not in CPU_PRECISIONS:
            raise ValueError(f"cpu_precision must be one of {CPU_PRECISIONS}, not {self.cpu_precision!r}")
        if self.cpu_isa not in CPU_ISAS:
            raise ValueError(f"cpu_isa must be one of {CPU_ISAS}, not {self.cpu_isa!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, not {self.kv_cache_dtype!r}")
        if self.kv_cache_dtype != "float32" and self.name in ("cupy", "sim"):  # not ignored without a word
            where = "in dtype" if self.name == "cupy" else "simulated"
            raise ValueError(f"kv_cache_dtype is a numpy backend setting (the {self.name} backend's cache is {where})")
        if self.cpu_isa != "auto" and self.name in ("cupy", "sim"):
            raise ValueError(f"cpu_isa is a numpy backend setting (the {self.name} backend runs no C kernels)")
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {CUDA_GRAPH_MODES}, not {self.cuda_graphs!r}")
        if self.cuda_graph_max_batch < 1:
            raise ValueError(f"cuda_graph_max_batch must be at least 1, not {self.cuda_graph_max_batch}")
        if self.sim_faults:  # a typo fails at start-up, naming the item
            from backends.sim_backend.faults import parse_faults  # noqa: PLC0415 - the sim package imports us

            parse_faults(self.sim_faults)
