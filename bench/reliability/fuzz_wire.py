"""One protocol case over its own TCP connection: write its bytes as they are, read what comes back (HTTP/1.x
responses, framed by Content-Length, chunked or the connection's end), bounded in time, and judge it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from bench.reliability.fuzz_checks import JSON, error_problems, media_type
from bench.reliability.protocol_cases import ProtocolCase

PART_GAP_S = 0.05  # between the parts of a case: a request split across packets
HEADERS_END = b"\r\n\r\n"
MAX_HEAD_BYTES = 1 << 20

NO_ANSWER = "no-answer"  # the connection stayed open, nothing (or not all) came back in time
CLOSED = "closed"  # the server closed the connection
ANSWERED = "answered"  # every answer the case asked for came back
GARBLED = "garbled"  # bytes that are not an HTTP response


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    version: str = "HTTP/1.1"

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")

    @property
    def status_line(self) -> str:
        return f"{self.status} {self.header('Content-Type') or '(no Content-Type)'}"


@dataclass(frozen=True)
class Exchange:
    responses: tuple[RawResponse, ...]
    ending: str  # NO_ANSWER, CLOSED, ANSWERED or GARBLED
    detail: str = ""


class _Garbled(Exception):
    pass


async def exchange(host: str, port: int, case: ProtocolCase, timeout_s: float) -> Exchange:
    got: list[RawResponse] = []
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                await _write(writer, case)
                return await _read_all(reader, case, got)
            finally:
                writer.close()
    except TimeoutError:
        return Exchange(tuple(got), NO_ANSWER, f"nothing more within {timeout_s:g} s")
    except (_Garbled, ValueError, asyncio.IncompleteReadError) as exc:  # ValueError: a bad length or chunk size
        return Exchange(tuple(got), GARBLED, str(exc)[:300])
    except OSError as exc:
        return Exchange(tuple(got), CLOSED, f"{type(exc).__name__}: {exc}")


async def _write(writer: asyncio.StreamWriter, case: ProtocolCase) -> None:
    """Write every part; a server that hangs up early may make writing fail, and then its answer is read."""
    with contextlib.suppress(OSError):
        for i, part in enumerate(case.parts):
            if i:
                await asyncio.sleep(PART_GAP_S)
            writer.write(part)
            await writer.drain()
        if case.half_close:
            writer.write_eof()


async def _read_all(reader: asyncio.StreamReader, case: ProtocolCase, got: list[RawResponse]) -> Exchange:
    while len(got) < case.answers:
        response = await _read_response(reader, case.head)
        if response is None:
            return Exchange(tuple(got), CLOSED)
        got.append(response)
    return Exchange(tuple(got), ANSWERED)


async def _read_response(reader: asyncio.StreamReader, head_only: bool) -> RawResponse | None:
    """The next final response (1xx skipped); None when the connection ends before one begins."""
    while True:
        try:
            head = await reader.readuntil(HEADERS_END)
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise _Garbled(f"the connection ended inside a response head: {exc.partial[:200]!r}") from None
            return None
        except asyncio.LimitOverrunError:
            raise _Garbled("a response head without an end") from None
        version, status, headers = _parse_head(head)
        if status >= 200:
            body = b"" if head_only else await _read_body(reader, status, headers)
            return RawResponse(status, headers, body, version)


def _parse_head(head: bytes) -> tuple[str, int, tuple[tuple[str, str], ...]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise _Garbled(f"not a status line: {lines[0][:200]!r}")
    headers = tuple((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line))
    return parts[0], int(parts[1]), headers


async def _read_body(reader: asyncio.StreamReader, status: int, headers: tuple[tuple[str, str], ...]) -> bytes:
    fields = {k.lower(): v for k, v in headers}
    if status in (204, 304):
        return b""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return await _read_chunked(reader)
    if "content-length" in fields:
        return await reader.readexactly(int(fields["content-length"]))
    return await reader.read()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16):
        body += (await reader.readexactly(size + 2))[:-2]
    await reader.readuntil(b"\r\n")  # the empty trailer section
    return body


def problems(case: ProtocolCase, result: Exchange) -> list[str]:
    """Never a 5xx; every error OpenAI's JSON; the answers the case requires; never silence on an open
    connection (once something was answered, an open connection is just waiting for the next request)."""
    found = [f"{r.status} from the server" for r in result.responses if r.status >= 500]
    found += [f"a status line of {r.version}" for r in result.responses if r.version not in ("HTTP/1.0", "HTTP/1.1")]
    found += [p for r in result.responses if r.status >= 400 for p in _error_problems(case, r)]
    answered = len(result.responses)
    if result.ending == GARBLED or result.ending == NO_ANSWER and (not answered or answered < case.required):
        found.append(f"{result.ending}: {result.detail}")
    elif result.ending == CLOSED and answered < case.required:
        found.append(f"closed after {len(result.responses)} of {case.required} answers")
    return found


def _error_problems(case: ProtocolCase, response: RawResponse) -> list[str]:
    content_type = response.header("Content-Type")
    if case.head:  # no body to judge: only what it would have been
        return [] if media_type(content_type) == JSON else [f"error sent as {content_type or 'no Content-Type'}"]
    return error_problems(content_type, response.body)
