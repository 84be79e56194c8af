"""Heavy chat requests cost their sender: a neighbour's stream while two clients post chats that are costly to
render.

    python -m bench.reliability.heavy_chat [--seconds 10] [--streams 4]

Against one server (sim backend, cpu profile), `--streams` neighbours stream 64-token completions one after
another; their gaps between chunks and /health's latency are measured alone, then while two clients post back
to back (a) a chat with 2,000 tools (1.3 MB) and one with 3,000 messages, both over the server's limits
(max_tools, max_messages: refused by a shallow count, before anything is decoded in full or rendered), and
(b) 128 tools of 2 KB (over max_tool_bytes, refused the same way) and 2,000 short messages, which the limits
and the length bound let through (rendered and tokenized on a tokenizer thread, then refused for the
context). Targets: the neighbours' gap p99 under each attack within 2x their p99 alone; /health p99 under
100 ms throughout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bench.reliability.big_prompts import Attack, gap_line, phase, serve_attacks
from bench.reliability.common import Tally, verdict
from bench.stats import pct

CHAT = "/v1/chat/completions"
HEALTH_P99_S = 0.100


def tools(count: int, description_chars: int) -> list[dict[str, Any]]:
    """`count` function tools, each with a description of about `description_chars` and three arguments."""
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool number {i}. " + "Does a thing. " * (description_chars // 14),
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "the city"}, "days": {"type": "integer", "minimum": 1},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}} for i in range(count)]


def messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: fine, and you?"}
            for i in range(count)]


def chat(**fields: Any) -> bytes:
    return json.dumps({"messages": fields.pop("messages", messages(1)), "max_tokens": 1, **fields}).encode()


ATTACKS = {
    "2,000 tools and 3,000 messages": Attack(CHAT, (chat(tools=tools(2000, 330)), chat(messages=messages(3000)))),
    "128 tools and 2,000 messages": Attack(CHAT, (chat(tools=tools(128, 1900)), chat(messages=messages(2000)))),
}


async def run(url: str, seconds: float, streams: int) -> tuple[list[str], bool]:
    tally, checks = Tally(), {}
    sizes = ", ".join(f"{len(body) / 1e6:.2f} MB" for attack in ATTACKS.values() for body in attack.bodies)
    lines = [f"heavy chat: {streams} neighbour streams, {seconds:g} s a phase; bodies {sizes}"]
    alone, health = await phase(url, seconds, streams, None, tally)
    lines.append(gap_line("alone", alone, health))
    for name, attack in ATTACKS.items():
        gaps, health = await phase(url, seconds, streams, attack, tally)
        lines.append(gap_line(f"with {name}", gaps, health))
        checks[f"with {name}: gap p99 within 2x alone"] = pct(gaps, 0.99) <= 2 * pct(alone, 0.99)
        checks[f"with {name}: /health p99 under {HEALTH_P99_S * 1e3:g} ms"] = pct(health, 0.99) < HEALTH_P99_S
    checks["no attack answered 5xx"] = not any(kind.startswith("attack answered 5") for kind in tally.counts)
    marks, ok = verdict(checks)
    return [*lines, *tally.lines(), *marks], ok


def main(argv: Sequence[str] | None = None) -> int:
    return serve_attacks(argv, __doc__, ["--backend", "sim", "--sim-profile", "cpu"], run)


if __name__ == "__main__":
    raise SystemExit(main())
