"""Chat templates from model metadata, rendered in jinja2's immutable sandbox: a template is untrusted
input, so it must not reach Python internals or mutate the messages it is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML, the format SmolLM2 and many others were tuned on (the tests' template for tiny models).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template refused the conversation or failed to render; the message is for the client."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


class NoChatTemplate(ChatTemplateError):
    """The model has no chat template and none was given (as vLLM: no guessed default)."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str | None  # None: the model file has none and no --chat-template was given
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """`tools` (OpenAI's function definitions) reach only a template that reads them."""
        if self.source is None:
            raise NoChatTemplate("this model has no chat template; start the server with --chat-template FILE "
                                 "to give it one, or use /v1/completions")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        try:
            template = env.from_string(self.source)
            return template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **({"tools": tools} if tools else {}),
            )
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError, KeyError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
