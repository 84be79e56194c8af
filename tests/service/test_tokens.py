"""vLLM's POST /tokenize and POST /detokenize over real HTTP: the ids equal what generation uses, round trips
give the text back, and every bad input is an OpenAI error, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import processors

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, request

TEXT = "Hello there, how are you? Ünïcödé 🙂"
USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


def _tokenize(server: LiveServer, body: Any) -> dict[str, Any]:
    reply = post(server.url + "/tokenize", body)
    assert reply.status == 200, reply.body
    return reply.json()  # type: ignore[no-any-return]


def test_tokenize_is_the_tokenizers_ids_and_round_trips(sim_server: LiveServer, model_files: ModelFiles) -> None:
    out = _tokenize(sim_server, {"prompt": TEXT})
    ids = model_files.tokenizer.encode(TEXT)
    assert out == {"count": len(ids), "max_model_len": sim_server.engine.max_model_len, "tokens": ids,
                   "token_strs": None}
    back = post(sim_server.url + "/detokenize", {"tokens": out["tokens"]})
    assert back.status == 200 and back.json() == {"prompt": TEXT}


def test_token_strs_are_the_vocabulary_spellings(sim_server: LiveServer, model_files: ModelFiles) -> None:
    out = _tokenize(sim_server, {"prompt": "Hello world", "return_token_strs": True})
    assert out["token_strs"] == [model_files.tokenizer.fast.id_to_token(i) for i in out["tokens"]]
    assert len(out["token_strs"]) == out["count"]


def test_prompt_count_equals_a_completions_prompt_tokens(sim_server: LiveServer) -> None:
    count = _tokenize(sim_server, {"prompt": TEXT})["count"]
    done = post(sim_server.url + "/v1/completions", {"prompt": TEXT, "max_tokens": 1})
    assert done.json()["usage"]["prompt_tokens"] == count


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_form_equals_the_chat_endpoints_prompt(sim_server: LiveServer, add_generation_prompt: bool) -> None:
    out = _tokenize(sim_server, {"messages": USER, "add_generation_prompt": add_generation_prompt})
    chat = {"messages": USER, "max_tokens": 1, "add_generation_prompt": add_generation_prompt}
    done = post(sim_server.url + "/v1/chat/completions", chat)
    assert done.status == 200, done.body
    assert done.json()["usage"]["prompt_tokens"] == out["count"] > 0


def test_continue_final_message_ends_with_that_message(sim_server: LiveServer) -> None:
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    out = _tokenize(sim_server, {"messages": messages, "add_generation_prompt": False,
                                 "continue_final_message": True})
    text = post(sim_server.url + "/detokenize", {"tokens": out["tokens"]}).json()["prompt"]
    assert text.endswith("The answer is")
    closed = _tokenize(sim_server, {"messages": messages, "add_generation_prompt": False})
    assert closed["count"] > out["count"] and closed["tokens"][:out["count"]] == out["tokens"]


@pytest.fixture(scope="module")
def bos_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    """A tokenizer whose post-processor adds a BOS (GGUF tokenizers have none), so add_special_tokens shows."""
    tok = model_files.tokenizer
    fast = FastTokenizer.from_str(tok.fast.to_str())
    bos = tok.fast.id_to_token(tok.bos_token_id)
    fast.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.bos_token_id)])
    files = replace(model_files, tokenizer=replace(tok, fast=fast))
    server = LiveServer.start(sim_config(ServiceConfig(port=0)), cached_builder(files))
    yield server
    server.close()


def test_add_special_tokens_is_honored(bos_server: LiveServer, sim_server: LiveServer,
                                       model_files: ModelFiles) -> None:
    ids = model_files.tokenizer.encode(TEXT)
    bos = model_files.tokenizer.bos_token_id
    assert _tokenize(bos_server, {"prompt": TEXT})["tokens"] == [bos, *ids]  # vLLM's default for a prompt
    assert _tokenize(bos_server, {"prompt": TEXT, "add_special_tokens": False})["tokens"] == ids
    assert _tokenize(sim_server, {"prompt": TEXT, "add_special_tokens": True})["tokens"] == ids  # GGUF: no BOS
    chat = _tokenize(sim_server, {"messages": USER, "add_special_tokens": True})
    assert chat == _tokenize(sim_server, {"messages": USER})
    refused = post(bos_server.url + "/tokenize", {"messages": USER, "add_special_tokens": True})
    assert refused.status == 400 and refused.error()["param"] == "add_special_tokens"


def test_empty_inputs(sim_server: LiveServer) -> None:
    assert _tokenize(sim_server, {"prompt": ""})["tokens"] == []
    assert post(sim_server.url + "/detokenize", {"tokens": []}).json() == {"prompt": ""}


def test_the_served_model_and_its_aliases_are_accepted(sim_server: LiveServer) -> None:
    name = sim_server.state.model_name
    assert _tokenize(sim_server, {"model": name, "prompt": "a"})["count"] == 1
    assert post(sim_server.url + "/detokenize", {"model": name, "tokens": [100]}).status == 200


BAD: list[tuple[str, str, Any, int, str | None]] = [
    # (name, path, body, status, param)
    ("unknown model", "/tokenize", {"model": "gpt-9", "prompt": "a"}, 404, "model"),
    ("unknown model detokenize", "/detokenize", {"model": "gpt-9", "tokens": [1]}, 404, "model"),
    ("prompt and messages", "/tokenize", {"prompt": "a", "messages": USER}, 400, "messages"),
    ("neither", "/tokenize", {"add_special_tokens": True}, 400, "prompt"),
    ("unknown field", "/tokenize", {"prompt": "a", "frobnicate": 1}, 400, "frobnicate"),
    ("unknown field detokenize", "/detokenize", {"tokens": [1], "frobnicate": 1}, 400, "frobnicate"),
    ("token id too large", "/detokenize", {"tokens": [1, 10**6]}, 400, "tokens"),
    ("negative token id", "/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
    ("token id past int32", "/detokenize", {"tokens": [2**40]}, 400, "tokens[0]"),
    ("missing tokens", "/detokenize", {}, 400, "tokens"),
    ("tokens not a list", "/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("prompt not a string", "/tokenize", {"prompt": [1, 2]}, 400, "prompt"),
    ("not json", "/tokenize", b"prompt=hello", 400, None),
    ("not json detokenize", "/detokenize", b"{tokens: [1]", 400, None),
    ("empty messages", "/tokenize", {"messages": []}, 400, "messages"),
    ("unknown role", "/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("continue and generation prompt", "/tokenize", {"messages": USER, "continue_final_message": True}, 400,
     "continue_final_message"),
    ("continue an empty message", "/tokenize", {"messages": [{"role": "user", "content": ""}],
                                                "add_generation_prompt": False, "continue_final_message": True},
     400, "messages"),
    ("body over the limit", "/tokenize", {"prompt": "x" * 100_000}, 413, None),
]


@pytest.mark.parametrize(("name", "path", "body", "status", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_input(sim_server: LiveServer, name: str, path: str, body: Any, status: int, param: str | None) -> None:
    reply = post(sim_server.url + path, body)
    assert reply.status == status, reply.body
    error = reply.error()
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert reply.headers["Content-Type"].startswith("application/json")


def test_wrong_method_is_405(sim_server: LiveServer) -> None:
    assert request("GET", sim_server.url + "/tokenize").status == 405


def test_chat_form_with_tools_counts_the_tools_too(sim_server: LiveServer) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    without = _tokenize(sim_server, {"messages": USER})["count"]
    out = _tokenize(sim_server, {"messages": USER, "tools": tools})
    done = post(sim_server.url + "/v1/chat/completions", {"messages": USER, "max_tokens": 1, "tools": tools})
    assert done.status == 200, done.body
    assert done.json()["usage"]["prompt_tokens"] == out["count"] > without
