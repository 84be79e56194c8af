"""API keys: loading them, and checking a request's `Authorization: Bearer` header in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path

from service.config import ConfigError, ServiceConfig


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
    if header is None or not header.startswith("Bearer "):
        return False
    given = header[len("Bearer "):].strip().encode("utf-8")
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found
