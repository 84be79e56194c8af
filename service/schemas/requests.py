"""Request bodies. Fields are OpenAI's (plus vLLM's common sampling extensions); an unknown field is refused
with 400, as the OpenAI API does. Ranges are checked by SamplingParams; the bounds here only keep numbers
small enough for the engine's arrays."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

Int32 = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Role = Literal["system", "developer", "user", "assistant", "tool"]


class StreamOptions(Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, the usage so far in every chunk


class ContentPart(Struct):
    type: str
    text: str | None = None


class FunctionCall(Struct):  # extra fields ignored: clients send back what they accumulated (vLLM ignores them)
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Struct):
    """An assistant's earlier tool call, in the history (a streamed call's `index` and the like are ignored)."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessage(Struct):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]  # OpenAI's rule


class FunctionDefinition(Struct, forbid_unknown_fields=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema; None: no arguments
    strict: bool | None = None  # accepted: arguments always follow the schema when the grammar enforces them


class Tool(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDefinition


class ChosenFunction(Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: ChosenFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(Struct, forbid_unknown_fields=True):
    """OpenAI's response_format.json_schema. The schema is always enforced (strict or not): decoding follows
    it token by token."""

    name: str
    schema: dict[str, Any] | None = None  # None: any JSON object
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class CommonRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields both endpoints share."""

    model: str | None = None  # None: the served model
    n: Int32 = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    min_p: float | None = None
    seed: Seed | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int32] | None = None
    ignore_eos: bool = False
    min_tokens: Int32 = 0
    skip_special_tokens: bool = True
    # vLLM's: accepted for compatibility; byte-level detokenizing never puts spaces between special tokens,
    # which is what vLLM does with a fast tokenizer whatever this says
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM's: keep the last N prompt tokens; -1 or 0: as many as the context holds (as vLLM, whose slice by 0
    # keeps the whole prompt), and so does an N past the context length
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None
    priority: Int32 = 0
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's constrained decoding: at most one of these (or response_format); the backend name is accepted
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None


class CompletionRequest(CommonRequest, kw_only=True, forbid_unknown_fields=True):
    prompt: str | list[str | Int32 | list[Int32]]
    max_tokens: Int32 | None = 16
    logprobs: Int32 | None = None  # how many alternatives; 0: the sampled token's logprob only
    echo: bool | None = False
    suffix: str | None = None
    best_of: Int32 | None = None


class ChatRequest(CommonRequest, kw_only=True, forbid_unknown_fields=True):
    messages: list[ChatMessage]
    max_tokens: Int32 | None = None  # None: up to the context
    max_completion_tokens: Int32 | None = None
    logprobs: bool | None = False
    top_logprobs: Int32 | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, "none" without
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True


# --- vLLM's /tokenize and /detokenize ---
class TokenizeRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's two shapes in one: `prompt` (completion form) or `messages` (chat form), exactly one.
    add_special_tokens defaults to vLLM's per form (True for a prompt, False for messages: the chat template
    already spells its special tokens), so None here means "the form's default"."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    return_token_strs: bool = False
    tools: list[Tool] | None = None  # vLLM's: rendered as the chat endpoint renders them, so count matches


class DetokenizeRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    tokens: list[Int32]
