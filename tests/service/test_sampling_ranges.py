"""A sampling parameter outside OpenAI's range is a 400 that names it; the range's ends are accepted."""

from __future__ import annotations

from typing import Any

import pytest
from openai import BadRequestError, OpenAI

from tests.service.live import LiveServer
from tests.service.rawhttp import post

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]

OUT_OF_RANGE: list[tuple[str, Any]] = [
    ("temperature", -0.1), ("temperature", 2.01),
    ("top_p", 0), ("top_p", -0.5), ("top_p", 1.01),
    ("presence_penalty", -2.1), ("presence_penalty", 2.1),
    ("frequency_penalty", -2.5), ("frequency_penalty", 3),
    ("repetition_penalty", 0), ("repetition_penalty", -1),
    ("min_p", -0.1), ("min_p", 1.5),
    ("top_k", -2),
    ("n", 0), ("n", -1),
    ("min_tokens", -1),
]
AT_THE_ENDS: list[tuple[str, Any]] = [
    ("temperature", 0), ("temperature", 2), ("top_p", 1), ("top_p", 1e-9), ("presence_penalty", -2),
    ("presence_penalty", 2), ("frequency_penalty", -2), ("frequency_penalty", 2), ("min_p", 0), ("min_p", 1),
    ("top_k", -1), ("top_k", 0),
]


@pytest.mark.parametrize("path", [CMPL, CHAT])
@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE, ids=[f"{f}={v}" for f, v in OUT_OF_RANGE])
def test_out_of_range_is_400_naming_it(sim_server: LiveServer, path: str, field: str, value: Any) -> None:
    body: dict[str, Any] = {"prompt": "hi"} if path == CMPL else {"messages": USER}
    reply = post(sim_server.url + path, {**body, "max_tokens": 2, field: value})
    assert reply.status == 400, reply.body
    error = reply.error()
    assert error["param"] == field and error["type"] == "invalid_request_error" and field in error["message"]


@pytest.mark.parametrize(("field", "value"), AT_THE_ENDS, ids=[f"{f}={v}" for f, v in AT_THE_ENDS])
def test_the_range_ends_are_accepted(sim_server: LiveServer, field: str, value: Any) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": "hi", "max_tokens": 2, field: value})
    assert reply.status == 200, reply.body


def test_an_overflowing_number_is_out_of_range(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, b'{"prompt": "hi", "temperature": 1e400}')
    assert reply.status == 400 and reply.error()["param"] == "temperature"


def test_the_client_sees_a_bad_request(sim_server: LiveServer) -> None:
    client = OpenAI(base_url=sim_server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=USER,  # type: ignore[arg-type]
                                       temperature=3)
    assert info.value.status_code == 400 and "temperature" in str(info.value)
