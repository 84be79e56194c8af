"""API keys: loading them, and checking a request's `Authorization: Bearer` header in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path

from service.config.settings import ConfigError, ServiceConfig

TOKEN_ROUTES = ("/tokenize", "/detokenize")
DASHBOARD_FEED = "/dashboard/events"  # the dashboard's data; its page (GET /dashboard) holds none and stays open


def load_keys(config: ServiceConfig) -> tuple[bytes, ...]:
    """The keys given directly plus those in the key file (one per line; blanks and '#' comments skipped)."""
    keys = list(config.api_keys)
    if config.api_key_file:
        try:
            lines = Path(config.api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read api_key_file {config.api_key_file}: {exc}") from None
        keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return tuple(k.encode("utf-8") for k in keys)


def authorized(header: str | None, keys: tuple[bytes, ...]) -> bool:
    """Whether the header carries one of the keys. Every key is compared, each in constant time, so the
    answer's timing says nothing about which key (or how much of one) matched."""
    given = bearer_token(header)
    if given is None:
        return False
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


def bearer_token(header: str | None) -> bytes | None:
    """The token of `Authorization: Bearer <token>`, as the bytes sent. The scheme is case-insensitive (RFC
    7235); bytes that are not UTF-8 arrive as lone surrogates and go back to what they were."""
    parts = (header or "").split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    try:
        return parts[1].strip().encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte decodes to: not a key
        return None


def needs_key(path: str) -> bool:
    """The routes that need a key when keys are configured: the API (/v1/*), the token routes and the dashboard's
    feed; /health, /metrics and /openapi.json stay open for load balancers, scrapers and tools."""
    return path.startswith("/v1/") or path in TOKEN_ROUTES or path == DASHBOARD_FEED
