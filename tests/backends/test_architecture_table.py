"""backends/model/architecture.py is the one description of a family: the loaders read the tensors it lists, and
no backend code compares anything with a family's name (a forward pass reads the Architecture's fields)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backends.model.architecture import ARCHITECTURES, LLAMA_LAYER, Architecture
from backends.model.config import ModelConfig
from backends.model.hf_checkpoint import _layer_shapes

BACKENDS = Path(__file__).resolve().parents[2] / "backends"


def backend_sources() -> list[Path]:
    """Every module of backends/ but the model package, where the formats name their families."""
    return [p for p in sorted(BACKENDS.rglob("*.py")) if (BACKENDS / "model") not in p.parents]


def family_comparisons(source: str, where: str) -> list[str]:
    """`x == "llama"`, `arch in ("qwen2", "qwen3")` and the like: each comparison with a family's name."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value in ARCHITECTURES
                for side in (node.left, *node.comparators) for c in ast.walk(side)):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_backend_branches_on_a_familys_name() -> None:
    sources = backend_sources()
    assert len(sources) > 20
    broken = [line for path in sources for line in family_comparisons(path.read_text(), str(path))]
    assert not broken, "compare the Architecture's fields, not the family's name:\n" + "\n".join(broken)


def test_a_comparison_with_a_familys_name_is_found() -> None:
    source = "def f(c):\n    return c.architecture in ('qwen2', 'other') or c.arch.qk_norm or c.name == 'x'\n"
    assert family_comparisons(source, "forward.py") == [
        "forward.py:2: c.architecture in ('qwen2', 'other')"]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_family_lists_llamas_layer_and_what_its_features_add(name: str) -> None:
    arch = ARCHITECTURES[name]
    plain = Architecture(name)
    assert arch.layer_tensors[:len(LLAMA_LAYER)] == plain.layer_tensors == tuple(f"{t}.weight" for t in LLAMA_LAYER)
    extra = set(arch.layer_tensors) - set(plain.layer_tensors)
    assert ({"attn_q_norm.weight", "attn_k_norm.weight"} <= extra) == arch.qk_norm
    assert ({"post_attention_norm.weight", "post_ffw_norm.weight"} <= extra) == arch.sandwich_norms
    assert ({"attn_q.bias", "attn_k.bias", "attn_v.bias"} <= extra) == arch.qkv_bias
    config = ModelConfig("m", name, 2, 64, 128, 4, 2, 16, 1e4, 1e-6, 100, 256, 1, (2,))
    assert tuple(_layer_shapes(config)) == arch.layer_tensors  # what a checkpoint is checked against
