"""Response bodies and streaming chunks, in OpenAI's shapes. Chunks omit `usage` unless it is set; every
other None is sent as null, as OpenAI does."""

from __future__ import annotations

from msgspec import Struct


class PromptTokensDetails(Struct):
    cached_tokens: int


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


# --- /v1/completions ---
class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(Struct):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None


class CompletionChunk(Struct, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# --- /v1/chat/completions ---
class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    content: list[ChatTokenLogprob] | None


class FunctionCallOut(Struct):
    name: str
    arguments: str


class ToolCallOut(Struct):
    id: str
    type: str
    function: FunctionCallOut


class AssistantMessage(Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCallOut] | None = None  # omitted when the model called none


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletion(Struct):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None


class FunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    """A piece of a streamed tool call: the first carries id, type and name, the next ones argument text."""

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionDelta | None = None


class ChatDelta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatChunk(Struct, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# --- /v1/models, /health ---
class ModelCard(Struct):
    id: str
    object: str
    created: int
    owned_by: str
    max_model_len: int | None = None


class ModelList(Struct):
    object: str
    data: list[ModelCard]


class Health(Struct, omit_defaults=True):
    status: str  # loading | ready | degraded | draining | stopped | failed | unhealthy
    reason: str | None = None  # why, when degraded


# --- /tokenize, /detokenize (vLLM's) ---
class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(Struct):
    prompt: str
