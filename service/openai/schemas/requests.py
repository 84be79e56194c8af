"""Request bodies. Fields are OpenAI's (plus vLLM's common sampling extensions); an unknown field is refused
with 400, as the OpenAI API does. The bounds here are SamplingParams' own (which checks them again for callers
without HTTP), so that the OpenAPI document generated from these types says what the server accepts; the
rules one field's type cannot state are added to the document by service/app/openapi_rules.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from scheduler.params import MAX_N, MAX_STOP_STRINGS, MAX_TEMPERATURE, MAX_TOP_LOGPROBS

INT32_MAX = 2**31 - 1
Int32 = Annotated[int, Meta(ge=-(2**31), le=INT32_MAX)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
TokenId = Annotated[int, Meta(ge=0, le=INT32_MAX)]
Positive = Annotated[int, Meta(ge=1, le=INT32_MAX)]
Count = Annotated[int, Meta(ge=0, le=INT32_MAX)]
Choices = Annotated[int, Meta(ge=1, le=MAX_N)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]
Text = Annotated[str, Meta(min_length=1)]
Role = Literal["system", "developer", "user", "assistant", "tool"]


class StreamOptions(Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, the usage so far in every chunk


class ContentPart(Struct):
    type: Literal["text"]  # text only: no images or audio
    text: str


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
    n: Choices = 1
    temperature: Annotated[float, Meta(ge=0.0, le=MAX_TEMPERATURE)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT32_MAX)] | None = None  # -1 or 0: off
    min_p: Fraction | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    stop: Text | Annotated[list[Text], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: Count = 0
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
    guided_regex: Text | None = None
    guided_choice: Annotated[list[Text], Meta(min_length=1)] | None = None
    guided_grammar: Text | None = None
    guided_decoding_backend: str | None = None


class CompletionRequest(CommonRequest, kw_only=True, forbid_unknown_fields=True):
    # a text, texts, token ids or lists of token ids (not a mixture: service/app/openapi_rules.py says so)
    prompt: Text | Annotated[list[Text | TokenId | Annotated[list[TokenId], Meta(min_length=1)]], Meta(min_length=1)]
    max_tokens: Positive | None = 16
    logprobs: TopLogprobs | None = None  # how many alternatives; 0: the sampled token's logprob only
    echo: bool | None = False
    suffix: str | None = None
    best_of: Int32 | None = None


class ChatRequest(CommonRequest, kw_only=True, forbid_unknown_fields=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_tokens: Positive | None = None  # None: up to the context
    max_completion_tokens: Positive | None = None
    logprobs: bool | None = False
    top_logprobs: TopLogprobs | None = None
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
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    return_token_strs: bool = False
    tools: list[Tool] | None = None  # vLLM's: rendered as the chat endpoint renders them, so count matches


class DetokenizeRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    tokens: list[TokenId]
