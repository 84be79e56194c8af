"""What each setting means, in words: the one source of the flags' help (`pagedserve serve --help`) and of the
settings table in docs/CONFIG.md, which `python -m service.config.settings_table` prints and a test compares.

Keys are "section.key", as in the config file. The choices come from the constants the config classes check
against, so a new value shows in the help once it is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from backends.config import CPU_ISAS, CPU_KERNELS, CPU_PRECISIONS, CUDA_GRAPH_MODES, KV_CACHE_DTYPES, WEIGHTS
from backends.sim_backend.clock import CLOCKS
from backends.sim_backend.profiles import MODEL_SHAPES, PROFILES
from kvpool.config import KV_LAYOUTS
from scheduler.config import BATCHING, SCHEDULING, SPECULATIVE_METHODS
from service.config.settings import LOG_LEVELS, PRESETS, TRACE_EXPORTERS, Setting

DTYPES = ("float32", "float16", "bfloat16")  # BackendConfig checks the same three


@dataclass(frozen=True)
class SettingDoc:
    text: str  # what the setting does
    choices: tuple[str, ...] = ()  # the allowed values, where there is a fixed set
    values: str = ""  # the values in words, where neither the type nor a set says enough
    default: str = ""  # the default in words, where the value alone says too little


DOCS: Mapping[str, SettingDoc] = MappingProxyType({
    "service.host": SettingDoc("address to listen on"),
    "service.port": SettingDoc("port to listen on; 0: any free port (the bound one is printed)"),
    "service.api_keys": SettingDoc("an accepted API key; may be repeated, each also a comma-separated list",
                                   default="none (no auth)"),
    "service.api_key_file": SettingDoc("file of accepted API keys, one per line ('#' comments and blank lines "
                                       "skipped)", values="path or none"),
    "service.served_model_name": SettingDoc("a name of the model in the API: any is accepted in a request's "
                                            "\"model\", the first is reported (/v1/models, responses); may be "
                                            "repeated, each also a comma-separated list",
                                            default="the model's name"),
    "service.max_body_bytes": SettingDoc("largest request body; a bigger one is refused with 413",
                                         default="`2097152` (2 MiB)"),
    "service.request_timeout_s": SettingDoc("seconds a request may run before it is aborted"),
    "service.read_timeout_s": SettingDoc("seconds within which a request's headers, then its body, must arrive"),
    "service.keepalive_timeout_s": SettingDoc("seconds after which an idle connection is closed"),
    "service.max_header_bytes": SettingDoc("longest request line and header field; longer is refused with 431"),
    "service.max_headers": SettingDoc("most header fields in a request; more is refused with 431"),
    "service.drain_timeout_s": SettingDoc("seconds in-flight requests may finish after SIGTERM or SIGINT"),
    "service.step_timeout_s": SettingDoc("seconds a step may run before the server counts it a hang, fails and "
                                         "exits; 0: no watchdog"),
    "service.tokenizer_threads": SettingDoc("threads rendering chat templates and tokenizing prompts (a "
                                            "completion prompt under 16 Ki characters is tokenized inline)"),
    "service.tokenizer_queue": SettingDoc("prompts waiting for or on the tokenizer threads; more are refused with "
                                          "503 tokenizer_busy and Retry-After"),
    "service.max_messages": SettingDoc("messages in a chat request; more are refused with 400 before rendering"),
    "service.max_tools": SettingDoc("tools in a request; more are refused with 400 before rendering"),
    "service.max_tool_bytes": SettingDoc("bytes of a request's tool definitions as JSON, all together; more are "
                                         "refused with 400 before rendering", default="`262144` (256 KiB)"),
    "service.health_window_s": SettingDoc("seconds of recent engine steps /health judges: it answers 503 "
                                          "degraded while health_failure_rate of them failed (and at least 3)"),
    "service.health_failure_rate": SettingDoc("share of the window's steps that failed for /health to answer "
                                              "503 degraded", values="(0, 1]"),
    "service.stall_report_s": SettingDoc("seconds a step may run (and 10x its predicted time) before /health "
                                         "answers 503 degraded; the watchdog (step_timeout_s) still decides when "
                                         "the server exits"),
    "service.max_stream_events_per_s": SettingDoc("SSE events per second over all streams; 0: off, one event "
                                                  "per engine output"),
    "service.log_prompts": SettingDoc("log prompts and outputs (private otherwise)"),
    "service.log_level": SettingDoc("the log's level", choices=LOG_LEVELS),
    "service.preset": SettingDoc("a named set of scheduler settings, under any given explicitly (docs/CONFIG.md: "
                                 "Presets)", choices=tuple(PRESETS)),
    "service.cors_allow_origins": SettingDoc("an origin browsers may call from (https://host[:port]), or \"*\" "
                                             "for any (then without credentials); may be repeated, each also "
                                             "a comma-separated list", default="none (no CORS headers)"),
    "service.dashboard": SettingDoc("serve the live view of the engine: GET /dashboard, and its feed GET "
                                    "/dashboard/events (behind the API key); off: both answer 404"),
    "backend.name": SettingDoc("the backend that runs the model", values="numpy, cupy, sim or a plugin's name"),
    "backend.model": SettingDoc("the model: a GGUF file, or a Hugging Face checkpoint directory (config.json, "
                                "safetensors, tokenizer.json)", values="path or none",
                                default="the installed default model"),
    "backend.chat_template": SettingDoc("a Jinja chat template file: replaces the model's own, or gives a model "
                                        "without one chat (without: chat requests get 400)", values="path or none",
                                        default="the model file's own"),
    "backend.dtype": SettingDoc("cupy only: the precision of activations, the KV cache and dense weights",
                                choices=DTYPES),
    "backend.cpu_kernels": SettingDoc(
        "numpy only: auto (the C kernels where they build, else NumPy), native (the C kernels or an error), "
        "numpy; the C kernels run the fused step (up to 64 tokens; 512 with the weights as stored), decode and "
        "prefill attention, projections",
        choices=CPU_KERNELS),
    "backend.weights": SettingDoc(
        "gguf: each weight matrix as the file stores it, where a kernel reads its type (Q4_0, Q4_1, Q8_0, Q5_0, "
        "Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16; cupy holds F16 / BF16 matrices in dtype); float32: "
        "dequantized at load (the reference, 5.5x the memory and the bytes per step; on cupy, every matrix in "
        "dtype)", choices=WEIGHTS),
    "backend.cpu_precision": SettingDoc(
        "numpy only: exact (float32 arithmetic on the exactly dequantized weights), fast (bfloat16 products "
        "for batches, on AMX; 8-bit activations and integer products for steps of 1-3 rows on Q4_0 / Q4_1 / "
        "Q5_0 / Q5_1 / Q8_0 / K-quant weights, and of up to 64 rows on AVX-512 CPUs where no tile reads them; "
        "docs/CONFIG.md: CPU precision)", choices=CPU_PRECISIONS),
    "backend.cpu_isa": SettingDoc(
        "numpy only: the CPU tier the C kernels are built for (its instruction set); auto: the highest this CPU "
        "runs; a tier the CPU cannot run is refused at start-up, naming what it lacks (docs/CONFIG.md: CPU "
        "tiers)", choices=CPU_ISAS),
    "backend.kv_cache_dtype": SettingDoc(
        "numpy only: the KV cache's element type; float16 holds twice the tokens in kv_cache_memory and halves "
        "the bytes attention reads, each value rounded once as it is stored (docs/CONFIG.md: KV cache in "
        "float16); the other backends refuse it (cupy's cache is in dtype)", choices=KV_CACHE_DTYPES),
    "backend.cuda_graphs": SettingDoc(
        "cupy only: pure decode steps replay a CUDA graph of their batch-size bucket (1, 2, 4, then multiples of 8; "
        "padded to it), sampling inside it where no top-k / top-p, penalty, grammar or top logprobs need the "
        "eager sampler; mixed and prefill steps run eagerly. eager: every bucket captured at start-up (its time "
        "and memory logged); lazy: a bucket at its first step; off", choices=CUDA_GRAPH_MODES),
    "backend.cuda_graph_max_batch": SettingDoc(
        "cupy only: the largest decode batch replayed from a CUDA graph (the largest bucket; the server uses at "
        "most scheduler.max_num_seqs); larger steps run eagerly"),
    "backend.sim_profile": SettingDoc("sim only: the hardware whose step times are simulated",
                                      choices=tuple(PROFILES)),
    "backend.sim_clock": SettingDoc("sim only: real (steps take real time) or virtual (a counter advances)",
                                    choices=tuple(CLOCKS)),
    "backend.sim_seed": SettingDoc("sim only: seed of the tokens drawn and of the random faults"),
    "backend.sim_model": SettingDoc(
        "sim only: cost steps as a model of that shape would, for capacity planning (the served model's "
        "tokenizer still draws the tokens)", choices=tuple(MODEL_SHAPES), default="none (the served model)"),
    "backend.sim_faults": SettingDoc("sim only: injected failures, for tests and drills (docs/CONFIG.md: "
                                     "Fault injection)", values="fault spec", default="none"),
    "scheduler.max_num_seqs": SettingDoc("most sequences in one step"),
    "scheduler.max_num_batched_tokens": SettingDoc("most tokens in one step (prompt chunks and decode tokens)"),
    "scheduler.max_model_len": SettingDoc("longest sequence, prompt and output, in tokens; 0: the model's "
                                          "context"),
    "scheduler.batching": SettingDoc("continuous (sequences join and leave at every step) or static (no sequence "
                                     "joins a batch once it decodes)", choices=BATCHING),
    "scheduler.scheduling": SettingDoc("fcfs (first come, first served) or priority (by each request's "
                                       "priority)", choices=SCHEDULING),
    "scheduler.max_waiting_requests": SettingDoc("requests that may wait for a place; more are refused with "
                                                 "503 queue_full"),
    "scheduler.max_waiting_tokens": SettingDoc("prompt tokens that may wait; more are refused with 503 "
                                               "queue_full"),
    "scheduler.max_preemptions": SettingDoc(
        "times a sequence may be preempted and recomputed; the next preemption fails its request with 503 "
        "kv_cache_exhausted; 0: the first does"),
    "scheduler.itl_target_ms": SettingDoc(
        "ms a step may take while sequences decode: prefill beside them is cut to fit; auto: twice the step's "
        "decode part times (prompts waiting + sequences decoding) / sequences decoding, at least 100 ms (/metrics' "
        "itl_target_seconds shows the limit in force); 0: off, prefill takes the token budget "
        "(docs/CONFIG.md: The ITL target)",
        values="auto or ms", default="`auto` (at least 100 ms)"),
    "scheduler.min_prefill_chunk": SettingDoc("prompt tokens a step's first prompt chunk always gets, however "
                                              "tight the ITL target"),
    "scheduler.failed_step_retry_s": SettingDoc(
        "seconds a failed step of several requests may spend re-running in halves to find the request that made "
        "it fail, which then fails alone; 0: no re-run, every request of the step fails"),
    "scheduler.debug_checks": SettingDoc(
        "after every step, check the scheduler's rows against its sequences and the KV pool, and the pool's "
        "invariants; a mismatch fails the engine (slow: for debugging)"),
    "kv.block_size": SettingDoc("tokens per KV cache block"),
    "kv.kv_cache_memory": SettingDoc("memory for the KV cache", values="size (2GiB, 512MiB, ...)"),
    "kv.num_blocks": SettingDoc("KV cache blocks, instead of the memory budget (the full-attention layers' "
                                "where the sliding-window layers have a pool of their own)"),
    "kv.num_window_blocks": SettingDoc("blocks of the sliding-window layers' own pool (a model with both kinds of "
                                       "layer, such as Gemma 3, in the paged layout); unset: enough for "
                                       "max_num_seqs windows and one step's prompt chunks, and the full-attention "
                                       "layers get the rest of the memory budget"),
    "kv.enable_prefix_caching": SettingDoc("reuse the KV blocks of a prompt prefix already computed"),
    "kv.kv_layout": SettingDoc("paged (blocks as a sequence grows) or contiguous (each sequence reserves "
                               "max_model_len: the baseline without paging)", choices=KV_LAYOUTS),
    "speculative.speculative_method": SettingDoc(
        "speculative decoding: off, ngram (prompt lookup: a decoding sequence guesses the tokens that followed "
        "its last n tokens earlier in it) or draft (a smaller model with the same tokenizer, draft_model, guesses "
        "them); one step verifies the guesses beside the sequence's own token, and the output is the same token "
        "for token (docs/CONFIG.md: Speculative decoding)", choices=SPECULATIVE_METHODS),
    "speculative.num_speculative_tokens": SettingDoc(
        "most tokens a sequence guesses per step; each sequence's own count adapts below it to how its guesses "
        "fare"),
    "speculative.ngram_max": SettingDoc("longest n-gram prompt lookup matches (longer first, down to 1)"),
    "speculative.draft_model": SettingDoc("the draft method's model: a GGUF file or checkpoint directory with the "
                                          "served model's tokenizer, run by the same backend with a KV pool of its "
                                          "own", values="path", default="none"),
    "telemetry.trace_exporter": SettingDoc("where spans go; auto: OTLP/HTTP when a collector endpoint is set",
                                           choices=TRACE_EXPORTERS),
    "telemetry.otlp_endpoint": SettingDoc("the collector's base URL (also OTEL_EXPORTER_OTLP_ENDPOINT)",
                                          values="URL", default="none"),
    "telemetry.token_events": SettingDoc("per-token span events", values="all, every:N, none"),
    "telemetry.slow_token_factor": SettingDoc("a gap over this many times the request's median gap is a slow "
                                              "token"),
    "telemetry.record_content": SettingDoc("put each prompt and completion into its request span"),
})


def doc_of(setting: Setting) -> SettingDoc:
    return DOCS.get(setting.path, SettingDoc(""))  # none yet: a test names the setting
