"""Send one generated case over a shared aiohttp session and judge the answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from yarl import URL

from bench.reliability.fuzz_bodies import Expect
from bench.reliability.fuzz_cases import Case
from bench.reliability.fuzz_checks import SSE, error_problems, media_type, success_problems

SERVER_ERROR = "5xx"
ERROR_BODY = "bad error body"
BAD_SUCCESS = "bad 200 body"
UNEXPECTED = "unexpected status"
NO_ANSWER = "no answer"


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer (`failure` says why)
    content_type: str = ""
    body: bytes = b""
    failure: str = ""


@dataclass(frozen=True)
class Problem:
    category: str  # one of the constants above
    detail: str


async def send(session: aiohttp.ClientSession, base_url: str, case: Case, timeout_s: float) -> Answer:
    headers = {"Content-Type": "application/json"} if case.body is not None else {}
    url = URL(base_url + case.path, encoded=True)  # the path goes out as generated, unnormalized
    try:
        async with asyncio.timeout(timeout_s), session.request(case.method, url, data=case.body,
                                                               headers=headers) as resp:
            return Answer(resp.status, resp.headers.get("Content-Type", ""), await resp.read())
    except TimeoutError:
        return Answer(None, failure=f"no complete answer within {timeout_s:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        return Answer(None, failure=f"{type(exc).__name__}: {exc}")


def judge(case: Case, answer: Answer) -> list[Problem]:
    status = answer.status
    if status is None:
        return [Problem(NO_ANSWER, answer.failure)]
    found = [Problem(SERVER_ERROR, f"status {status}")] if status >= 500 else []
    if status >= 400:
        found += [Problem(ERROR_BODY, p) for p in error_problems(answer.content_type, answer.body)]
    elif status == 200:
        found += [Problem(BAD_SUCCESS, p) for p in _success_problems(case, answer)]
    if case.expect is Expect.SERVED and status != 200 or case.expect is Expect.REFUSED and not 400 <= status < 500:
        found.append(Problem(UNEXPECTED, f"{case.expect.value} case answered {status}"))
    return found


def _success_problems(case: Case, answer: Answer) -> list[str]:
    if case.stream and media_type(answer.content_type) != SSE:
        return [f"asked for a stream, answered {answer.content_type or 'no Content-Type'}"]
    return success_problems(case.route, answer.content_type, answer.body)
