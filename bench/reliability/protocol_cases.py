"""Hand-written and combinatorial HTTP/1.x cases below the level a client library lets through: broken
request lines, methods, headers, framing (Content-Length, chunked), content types and encodings, odd paths,
pipelining, connections cut short. Each is written as raw bytes on a connection of its own."""

from __future__ import annotations

import gzip
import itertools
from dataclasses import dataclass

BODY = b'{"prompt": "Hello", "max_tokens": 2}'
CHAT_BODY = b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}'
CMPL = b"/v1/completions"
CHAT = b"/v1/chat/completions"
ROUTES = (CMPL, CHAT, b"/v1/models", b"/v1/models/some-model", b"/health", b"/metrics", b"/no/such/route")
METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"FROB")
Headers = tuple[bytes, ...]


@dataclass(frozen=True)
class ProtocolCase:
    name: str
    parts: tuple[bytes, ...]  # written in order, a short pause between
    answers: int = 1  # responses to wait for
    required: int = 1  # of those, how many must come (0: closing without an answer is fine)
    half_close: bool = False  # shut the sending side after the last part (a request cut short)
    head: bool = False  # the answers carry no body (HEAD)


@dataclass(frozen=True)
class Wire:
    """Builds requests for one server: its Host header and the Authorization it needs (if any)."""

    host: bytes
    auth: Headers = ()

    def request(self, method: bytes = b"POST", target: bytes = CMPL, headers: Headers = (),
                body: bytes | None = BODY, version: bytes = b"HTTP/1.1", framing: bool = True) -> bytes:
        """A request; `framing` adds Content-Type and Content-Length for the body."""
        framed = (b"Content-Type: application/json", b"Content-Length: %d" % len(body)) if framing and body else ()
        lines = (method + b" " + target + b" " + version, b"Host: " + self.host, *self.auth, *framed, *headers)
        return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")

    def get(self, target: bytes = b"/health", headers: Headers = ()) -> bytes:
        return self.request(b"GET", target, headers, None)

    def line(self, request_line: bytes, headers: Headers = ()) -> bytes:
        """A request line of one's own, with the usual headers."""
        return b"\r\n".join((request_line, b"Host: " + self.host, *self.auth, *headers)) + b"\r\n\r\n"


def protocol_cases(host: str, api_key: str | None = None) -> tuple[ProtocolCase, ...]:
    wire = Wire(host.encode(), (b"Authorization: Bearer " + api_key.encode(),) if api_key else ())
    groups = (request_lines, methods_and_routes, headers, content_lengths, chunked, content_types, encodings,
              paths, connections, authorization)
    cases = tuple(case for group in groups for case in group(wire))
    names = [case.name for case in cases]
    assert len(names) == len(set(names)), "protocol case names must be unique"
    return cases


def _case(name: str, *parts: bytes, answers: int = 1, required: int = 1, half_close: bool = False,
          head: bool = False) -> ProtocolCase:
    return ProtocolCase(name, parts, answers, required, half_close, head)


def request_lines(w: Wire) -> list[ProtocolCase]:
    """Request lines a server must refuse (or may close on); a few it must serve despite their oddness."""
    garbage = {
        "garbage line": b"GARBAGE\r\n\r\n",
        "method only": b"GET\r\n\r\n",
        "http/0.9 request": b"GET /health\r\n\r\n",
        "http/0.9 version": w.line(b"GET /health HTTP/0.9"),
        "http/2.0 version": w.line(b"GET /health HTTP/2.0"),
        "http/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "http/9.9 version": w.line(b"GET /health HTTP/9.9"),
        "https scheme version": w.line(b"GET /health HTTPS/1.1"),
        "version not a number": w.line(b"GET /health HTTP/1.x"),
        "extra token in request line": w.line(b"GET /health HTTP/1.1 extra"),
        "nul in request line": w.line(b"GET /he\x00alth HTTP/1.1"),
        "tab separators": w.line(b"GET\t/health\tHTTP/1.1"),
        "request line of 100 KiB": w.line(b"GET /" + b"a" * 102_400 + b" HTTP/1.1"),
        "tls client hello": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(32)) + b"\r\n\r\n",
        "nul bytes": b"\x00" * 64 + b"\r\n\r\n",
        "connect method": w.line(b"CONNECT 127.0.0.1:443 HTTP/1.1"),
        "asterisk target": w.line(b"OPTIONS * HTTP/1.1"),
        "method with parenthesis": w.line(b"G(T /health HTTP/1.1"),
        "non-ascii method": w.line(b"G\xc3\x89T /health HTTP/1.1"),
        "lowercase method": w.line(b"get /health HTTP/1.1"),
    }
    served = {
        "http/1.0 request": w.line(b"GET /health HTTP/1.0"),
        "leading empty line": b"\r\n" + w.get(),
        "double spaces in request line": w.line(b"GET  /health  HTTP/1.1"),
        "bare lf line endings": w.get().replace(b"\r\n", b"\n"),
    }
    return ([_case(name, data, required=0) for name, data in garbage.items()]
            + [_case(name, data) for name, data in served.items()])


def methods_and_routes(w: Wire) -> list[ProtocolCase]:
    """Every method on every route: 200, 404 or 405, never anything else."""
    cases = []
    for method, route in itertools.product(METHODS, ROUTES):
        body = None if method in (b"GET", b"HEAD") else CHAT_BODY if route == CHAT else BODY
        name = f"{method.decode()} {route.decode()}"
        cases.append(_case(name, w.request(method, route, body=body), head=method == b"HEAD"))
    return cases


def headers(w: Wire) -> list[ProtocolCase]:
    bad = {
        "header without colon": (b"X-Broken header",),
        "header name with space": (b"X Broken: 1",),
        "space before colon": (b"X-Broken : 1",),
        "empty header name": (b": 1",),
        "obsolete line folding": (b"X-Folded: a", b" b"),
        "nul in header value": (b"X-Nul: a\x00b",),
        "cr in header value": (b"X-Cr: a\rb",),
        "header value of 64 KiB": (b"X-Big: " + b"a" * 65_536,),
        "header value of 9 KiB": (b"X-Big: " + b"a" * 9_216,),
        "header name of 9 KiB": (b"X-" + b"a" * 9_216 + b": 1",),
        "200 headers": tuple(b"X-Many-%d: %d" % (i, i) for i in range(200)),
        "5000 headers": tuple(b"X-Many-%d: %d" % (i, i) for i in range(5000)),
        "two host headers": (b"Host: other.example",),
        "non-utf-8 header value": (b"X-Latin: caf\xe9 \xff\xfe",),
        "utf-8 header value": ("X-Utf8: café 🙂".encode(),),
    }
    cases = [_case(name, w.request(headers=extra), required=0) for name, extra in bad.items()]
    no_host = b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    cases.append(_case("no host header", no_host % len(BODY) + b"".join(a + b"\r\n" for a in w.auth) + b"\r\n"
                       + BODY, required=0))
    return cases


def content_lengths(w: Wire) -> list[ProtocolCase]:
    def framed(*length: bytes, body: bytes = BODY) -> bytes:
        return w.request(headers=tuple(b"Content-Length: " + v for v in length), body=body, framing=False)

    n = b"%d" % len(BODY)
    values = {"-1": b"-1", "abc": b"abc", "+n": b"+" + n, "hex": b"0x%x" % len(BODY), "padded": b"  " + n + b"  ",
              "n, n": n + b", " + n, "n, n+1": n + b", %d" % (len(BODY) + 1), "overflow": b"9" * 24, "1e2": b"1e2",
              "empty": b""}
    cases = [_case(f"content-length {name}", framed(v), required=0) for name, v in values.items()]
    cases += [
        _case("two different content-lengths", framed(n, b"12"), required=0),
        _case("two equal content-lengths", framed(n, n), required=0),
        _case("content-length 0", framed(b"0", body=b""), required=0),
        _case("content-length shorter than the body", framed(b"10"), required=0, answers=2),
        _case("content-length longer than the body, then close", framed(b"500"), required=0, half_close=True),
        _case("content-length over the body limit, then close", framed(b"3000000"), required=0, half_close=True),
        _case("no content-length, no body", w.request(headers=(b"Content-Type: application/json",), body=None)),
    ]
    return cases


def _chunks(*sizes_and_data: tuple[bytes, bytes]) -> bytes:
    return b"".join(size + b"\r\n" + data + b"\r\n" for size, data in sizes_and_data)


def chunked(w: Wire) -> list[ProtocolCase]:
    te = (b"Content-Type: application/json", b"Transfer-Encoding: chunked")
    good = _chunks((b"%x" % len(BODY), BODY), (b"0", b""))
    bodies = {
        "chunked": (te, good, 1),
        "chunked in three pieces": (te, _chunks((b"5", BODY[:5]), (b"%x" % (len(BODY) - 5), BODY[5:]), (b"0", b"")), 1),
        "chunk extension": (te, _chunks((b"%x;name=value" % len(BODY), BODY), (b"0", b"")), 1),
        "chunk size not hex": (te, _chunks((b"zz", BODY), (b"0", b"")), 0),
        "negative chunk size": (te, _chunks((b"-1", BODY), (b"0", b"")), 0),
        "chunk size overflow": (te, _chunks((b"f" * 40, BODY), (b"0", b"")), 0),
        "chunk longer than its size": (te, _chunks((b"4", BODY), (b"0", b"")), 0),
        "chunked and content-length": (te + (b"Content-Length: 5",), good, 0),
        "gzip, chunked": ((te[0], b"Transfer-Encoding: gzip, chunked"), good, 0),
        "chunked, gzip": ((te[0], b"Transfer-Encoding: chunked, gzip"), good, 0),
        "unknown transfer-encoding": ((te[0], b"Transfer-Encoding: xchunked"), good, 0),
        "two transfer-encoding headers": (te + (b"Transfer-Encoding: chunked",), good, 0),
        "chunked on http/1.0": (te, good, 0),
    }
    cases = [_case(name, w.request(headers=hs, body=body, framing=False,
                                   version=b"HTTP/1.0" if "1.0" in name else b"HTTP/1.1"), required=required)
             for name, (hs, body, required) in bodies.items()]
    cases.append(_case("chunked without the last chunk, then close",
                       w.request(headers=te, body=_chunks((b"5", BODY[:5])), framing=False),
                       required=0, half_close=True))
    return cases


def content_types(w: Wire) -> list[ProtocolCase]:
    types = (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=xyz", None,
             b"application/json; charset=latin-1", b"application/json; charset=utf-8", b"APPLICATION/JSON",
             b"application/xml", b"*/*", b"application/json; charset")
    cases = []
    for ctype, (route, body) in itertools.product(types, ((CMPL, BODY), (CHAT, CHAT_BODY))):
        header = () if ctype is None else (b"Content-Type: " + ctype,)
        name = f"{route.decode()} as {ctype.decode() if ctype else 'no content-type'}"
        length = b"Content-Length: %d" % len(body)
        cases.append(_case(name, w.request(b"POST", route, (*header, length), body, framing=False)))
    return cases


def encodings(w: Wire) -> list[ProtocolCase]:
    def encoded(coding: bytes, body: bytes = BODY) -> bytes:
        return w.request(headers=(b"Content-Encoding: " + coding,), body=body)

    cases = [_case(f"content-encoding {c.decode()} on a plain body", encoded(c))
             for c in (b"gzip", b"deflate", b"br", b"zstd", b"identity", b"gzip, gzip", b"x-unknown")]
    bomb = gzip.compress(b'{"prompt": "' + b"a" * 20_000_000 + b'"}', compresslevel=1)
    cases += [_case("content-encoding gzip on a gzip body", encoded(b"gzip", gzip.compress(BODY))),
              _case("gzip body expanding to 20 MB", encoded(b"gzip", bomb))]
    return cases


def paths(w: Wire) -> list[ProtocolCase]:
    targets = (b"http://" + w.host + b"/health", b"http://example.com/v1/models", b"https://" + w.host + CMPL,
               b"/%zz", b"/%", b"/v1/%2e%2e/health", b"/../../etc/passwd", b"/v1/models/..%2f..%2fetc%2fpasswd",
               b"//health", b"/health?%%%&&==", b"/health#fragment", b"/v1/models/%00", b"/v1/models/\xff\xfe",
               b"/v1/models/" + b"a" * 5000, b"health", b"/v1/completions/", b"/V1/COMPLETIONS", b"/v1//models")
    return [_case(f"target {t.replace(w.host, b'{host}')[:60].decode('latin-1')!r}", w.request(b"GET", t, body=None))
            for t in targets]


def connections(w: Wire) -> list[ProtocolCase]:
    request = w.request()
    return [
        _case("two pipelined gets", w.get() + w.get(b"/v1/models"), answers=2, required=2),
        _case("two pipelined completions", request + w.request(b"POST", CHAT, body=CHAT_BODY), answers=2, required=2),
        _case("a get pipelined with garbage", w.get() + b"GARBAGE\r\n\r\n", answers=2, required=1),
        _case("a request split into bytes", *[request[i:i + 7] for i in range(0, len(request), 7)]),
        _case("closed mid-body", request[:-10], required=0, half_close=True),
        _case("closed mid-headers", request[:30], required=0, half_close=True),
        _case("closed before sending anything", b"", required=0, half_close=True),
        _case("expect 100-continue", w.request(headers=(b"Expect: 100-continue",))),
        _case("unknown expectation", w.request(headers=(b"Expect: 200-ok",)), required=0),
        _case("connection close", w.request(headers=(b"Connection: close",))),
        _case("upgrade to websocket", w.request(b"GET", b"/health", (b"Connection: Upgrade", b"Upgrade: websocket"),
                                                None), required=0),
        _case("upgrade to h2c", w.request(b"GET", b"/health", (b"Connection: Upgrade, HTTP2-Settings",
                                                               b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQAAP__"),
                                          None), required=0),
    ]


def authorization(w: Wire) -> list[ProtocolCase]:
    """Authorization values a key check must survive (refused with 401 when the server has keys)."""
    plain = Wire(w.host)
    values = (b"Bearer caf\xe9", b"Bearer \xff\xfe\xfd", b"Bearer \xc3(", b"Bearer a\x00b", b"Bearer",
              b"Bearer ", b"Basic dXNlcjpwYXNz", b"bearer x", b"Bearer " + b"k" * 8000, "Bearer ключ".encode())
    return [_case(f"authorization {v[:24]!r}", plain.request(headers=(b"Authorization: " + v,)), required=0)
            for v in values]
