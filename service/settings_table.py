"""The settings table of docs/CONFIG.md, rendered from the settings themselves (the words of
service/setting_docs.py, which `--help` shows too). `python -m service.settings_table` prints it; a test checks
that the doc holds exactly this table."""

from __future__ import annotations

from service.settings import Setting, all_settings, value_text, values_text

HEADER = ("| setting (file) | flag | environment | values | default | what it does |\n"
          "| --- | --- | --- | --- | --- | --- |")


def settings_table() -> str:
    return "\n".join([HEADER, *(_row(s) for s in all_settings())]) + "\n"


def _row(s: Setting) -> str:
    shown = value_text(s.default)
    default = s.doc.default or (shown if shown == "none" else f"`{shown}`")
    cells = (f"`{s.section}.{s.key}`", f"`{s.flag}`", f"`{s.env}`", values_text(s), default, s.doc.text)
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    print(settings_table(), end="")
