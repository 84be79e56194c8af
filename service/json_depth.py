"""How deeply a JSON text nests, measured without parsing it.

The JSON decoder recurses once per level of arrays and objects, also inside fields typed `Any` (`tools`,
`tool_choice`, `tool_calls`), so a body of 100,000 `[` would end in a RecursionError. Measuring first lets
such a body be refused with a 400 before it reaches the decoder.
"""

from __future__ import annotations

import re

import numpy as np

# A string, from its opening quote to its closing one, or to the end of the text when unterminated (that
# text is invalid anyway). Matching the leftmost quote never fails, so the scan stays linear.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
# Per byte outside strings: +1 for [ and {, -1 (as int8) for ] and }, 0 for anything else.
_STEP = bytes(1 if b in b"[{" else 255 if b in b"]}" else 0 for b in range(256))


def exceeds_depth(text: bytes, limit: int) -> bool:
    if text.count(b"[") + text.count(b"{") <= limit:  # too few brackets to nest that deep: the common case
        return False
    return nesting_depth(text) > limit


def nesting_depth(text: bytes) -> int:
    """The deepest level of nesting in a JSON text (0 for a scalar), brackets inside strings not counted."""
    steps = np.frombuffer(_STRING.sub(b"", text).translate(_STEP), np.int8)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))
