"""A setting in words, as `--help` (service/config/command.py) and docs/CONFIG.md's table show it: the settings of
service/config/settings.py with the words of service/config/setting_docs.py. `python -m
service.config.settings_table` prints the table; a test checks that the doc holds exactly this table."""

from __future__ import annotations

from typing import Any

from service.config.setting_docs import doc_of
from service.config.settings import Setting, all_settings

HEADER = ("| setting (file) | flag | environment | values | default | what it does |\n"
          "| --- | --- | --- | --- | --- | --- |")
_KIND_WORDS = {"int": "int", "float": "float", "auto_float": "auto or float", "str": "str", "bool": "bool",
               "strs": "list of str"}


def settings_table() -> str:
    return "\n".join([HEADER, *(_row(s) for s in all_settings())]) + "\n"


def _row(s: Setting) -> str:
    doc = doc_of(s)
    shown = value_text(s.default)
    default = doc.default or (shown if shown == "none" else f"`{shown}`")
    cells = (f"`{s.path}`", f"`{s.flag}`", f"`{s.env}`", values_text(s), default, doc.text)
    return "| " + " | ".join(cells) + " |"


def value_text(value: Any) -> str:
    """A value as a person would write it in the file or a flag; "none" for unset."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None or value in ("", ()):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return ", ".join(value) if isinstance(value, tuple) else str(value)


def values_text(setting: Setting) -> str:
    """The values a setting takes, in words: its choices, else the doc's words, else its kind."""
    doc = doc_of(setting)
    if doc.choices:
        return ", ".join(doc.choices) + (" or none" if setting.optional else "")
    if doc.values:
        return doc.values
    return _KIND_WORDS[setting.kind] + (" or none" if setting.optional else "")


def default_text(setting: Setting) -> str:
    return doc_of(setting).default.replace("`", "") or value_text(setting.default)


if __name__ == "__main__":
    print(settings_table(), end="")
