"""A Hugging Face checkpoint directory serves the model its GGUF does: SmolLM2 written as transformers writes it
(tests/golden/smollm2_hf: its config, generation config, tokenizer and template files, and the sha256 and greedy
tokens of transformers' own conversion of the GGUF, from make_checkpoint.py), with the weights rebuilt here from
the GGUF and written by the `safetensors` library, in shards; and bad directories refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from openai import OpenAI
from safetensors.numpy import save_file

from backends.config import BackendConfig
from backends.model.config import ModelLoadError
from backends.model.loader import LoadedModel, load_model, open_model
from backends.model.quant import QuantMatrix, dense
from backends.numpy_backend.native.weights import STORED_TYPES
from kvpool import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.app.server import build_runtime
from service.config.settings import AppConfig, ServiceConfig
from tests.backends.hf_checkpoints import hf_rows, hf_tensors, write_bfloat16
from tests.service.live import LiveServer
from tests.service.test_cli import assert_one_line_error, run

GOLDEN = Path(__file__).parent.parent / "golden" / "smollm2_hf"
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja")
EXPECTED = json.loads((GOLDEN / "weights.json").read_text())


def write_checkpoint(directory: Path, tensors: dict[str, np.ndarray], shards: int = 2) -> Path:
    """The golden small files, and the tensors in `shards` safetensors files with their index."""
    directory.mkdir(parents=True)
    for name in SMALL_FILES:
        shutil.copy(GOLDEN / name, directory / name)
    names, weight_map = sorted(tensors), dict[str, str]()
    for s in range(shards):
        part = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n] for n in names[s::shards]}
        save_file(chunk, str(directory / part))
        weight_map |= dict.fromkeys(chunk, part)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


@pytest.fixture(scope="module")
def tensors(real_model: LoadedModel) -> dict[str, np.ndarray]:
    return hf_tensors(real_model)


@pytest.fixture(scope="module")
def checkpoint(tensors: dict[str, np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("hf") / "SmolLM2-135M-Instruct", tensors)


def test_the_rebuilt_weights_are_transformers_own(tensors: dict[str, np.ndarray]) -> None:
    # transformers' GGUF conversion un-permutes Q and K itself: equal bytes prove hf_rows (and the layout the
    # loader permutes back) is Hugging Face's
    for name, digest in EXPECTED["sha256"].items():
        assert hashlib.sha256(tensors[name].tobytes()).hexdigest() == digest, name


def test_the_checkpoint_loads_the_ggufs_floats(checkpoint: Path, real_model: LoadedModel) -> None:
    loaded = load_model(checkpoint)
    ours, theirs = loaded.weights, real_model.weights
    assert loaded.config == real_model.config.__class__(**{**vars(real_model.config), "name": checkpoint.name})
    pairs = [(ours.embedding, theirs.embedding), (ours.final_norm, theirs.final_norm), (ours.lm_head, theirs.lm_head)]
    pairs += [(a, b) for mine, gguf in zip(ours.layers, theirs.layers, strict=True)
              for a, b in zip(mine.arrays(), gguf.arrays(), strict=True)]
    assert all(np.array_equal(dense(a), dense(b)) for a, b in pairs)
    assert ours.lm_head is ours.embedding  # tie_word_embeddings


def test_the_tokenizer_and_template_are_the_checkpoints(checkpoint: Path) -> None:
    _, files = open_model(checkpoint)
    for run_ in EXPECTED["runs"]:
        assert files.tokenizer.encode(run_["prompt"]) == run_["prompt_ids"]
    assert files.tokenizer.eos_token_ids == (2,) and files.tokenizer.bos_token_id == 1 and not files.tokenizer.add_bos
    rendered = files.chat_template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_generate_gives_transformers_greedy_tokens(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, files = open_model(checkpoint)  # float32 matrices: --weights gguf and float32 load the same floats
    for run_ in EXPECTED["runs"]:
        code, out, err = run(capsys, "generate", "--model", str(checkpoint), "--prompt", run_["prompt"],
                             "--max-tokens", str(len(run_["greedy"])))
        assert code == 0, err
        assert out.rstrip("\n") == files.tokenizer.decode(run_["greedy"]).rstrip("\n")


def test_served_over_http_under_the_directorys_name(checkpoint: Path) -> None:
    config = AppConfig(ServiceConfig(port=0), BackendConfig(name="numpy", model=str(checkpoint)),
                       SchedulerConfig(max_model_len=512), KVPoolConfig(num_blocks=64))
    server = LiveServer.start(config, build_runtime, timeout=120)
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
        case = EXPECTED["runs"][0]
        out = client.completions.create(model="SmolLM2-135M-Instruct", prompt=case["prompt"],
                                        max_tokens=len(case["greedy"]), temperature=0)
        assert out.usage is not None and out.usage.completion_tokens == len(case["greedy"])
        assert out.choices[0].text == open_model(checkpoint)[1].tokenizer.decode(case["greedy"])
    finally:
        server.close()


def test_float16_and_bfloat16_matrices_are_kept_as_stored(tmp_path: Path) -> None:
    tiny = tiny_checkpoint(tmp_path / "f32")
    tensors = hf_tensors(load_model(tiny))
    halves = {n: t.astype(np.float16) if t.ndim == 2 else t for n, t in tensors.items()}
    f16 = write_checkpoint(tmp_path / "f16", halves, shards=1)
    shutil.copy(tiny / "config.json", f16)
    f16_model = load_model(f16, stored=STORED_TYPES)
    layer = f16_model.weights.layers[0]
    assert isinstance(layer.wqkv, QuantMatrix) and layer.wqkv.qtype == GGMLQuantizationType.F16
    q = dense(layer.wqkv)[: f16_model.config.q_size]
    assert np.array_equal(hf_rows(q, f16_model.config.num_heads), halves["model.layers.0.self_attn.q_proj.weight"])
    bf16 = write_checkpoint(tmp_path / "bf16", {}, shards=1)
    shutil.copy(tiny / "config.json", bf16)
    write_bfloat16(bf16 / "model-00001-of-00001.safetensors", tensors)
    stored = load_model(bf16, stored=STORED_TYPES).weights.layers[1].w_down
    assert isinstance(stored, QuantMatrix) and stored.qtype == GGMLQuantizationType.BF16
    top = tensors["model.layers.1.mlp.down_proj.weight"].view(np.uint32) >> 16  # bfloat16: the top half
    assert np.array_equal(dense(stored).view(np.uint32), top << 16)


# --- bad directories -------------------------------------------------------------------------------------------


def tiny_checkpoint(directory: Path, **config: object) -> Path:
    """A 2-layer Llama of hidden 64 with the golden tokenizer: small enough to break in every way."""
    settings = {**json.loads((GOLDEN / "config.json").read_text()), "hidden_size": 64, "intermediate_size": 128,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                **config}
    rng = np.random.default_rng(0)
    h, f, v = 64, 128, settings["vocab_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (64, h),
                   p + "self_attn.k_proj.weight": (32, h), p + "self_attn.v_proj.weight": (32, h),
                   p + "self_attn.o_proj.weight": (h, 64), p + "post_attention_layernorm.weight": (h,),
                   p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                   p + "mlp.down_proj.weight": (h, f)}
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    write_checkpoint(directory, tensors, shards=2)
    (directory / "config.json").write_text(json.dumps(settings))
    return directory


def test_a_tiny_checkpoint_loads(tmp_path: Path) -> None:
    model = load_model(tiny_checkpoint(tmp_path / "tiny"))
    assert (model.config.num_layers, model.config.head_dim, model.config.rope_theta) == (2, 16, 100000.0)


def test_the_older_config_format_is_read(tmp_path: Path) -> None:
    """Before transformers 5, RoPE's base and scaling sat at the top level of config.json."""
    directory = tiny_checkpoint(tmp_path / "tiny")
    path = directory / "config.json"
    settings = {k: v for k, v in json.loads(path.read_text()).items() if k != "rope_parameters"}
    path.write_text(json.dumps({**settings, "rope_theta": 500000.0, "rope_scaling": None}))
    assert open_model(directory)[1].config.rope_theta == 500000.0
    path.write_text(json.dumps({**settings, "rope_scaling": {"type": "dynamic", "factor": 2.0}}))
    with pytest.raises(ModelLoadError, match="RoPE scaling 'dynamic' is not supported"):
        open_model(directory)


@pytest.mark.parametrize(("breakage", "message"), [
    (lambda d: (d / "config.json").unlink(), "config.json is missing"),
    (lambda d: (d / "model-00002-of-00002.safetensors").unlink(), "shard model-00002-of-00002.safetensors"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    (lambda d: _edit_config(d, intermediate_size=96), "has shape [128, 64], config.json implies [96, 64]"),
    (lambda d: _edit_config(d, model_type="bert"), "model_type 'bert' is not supported"),
    (lambda d: _edit_config(d, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6}), "RoPE scaling 'yarn'"),
    (lambda d: _edit_config(d, num_hidden_layers=3), "tensor model.layers.2.input_layernorm.weight is missing"),
    (lambda d: (d / "config.json").write_text("{"), "config.json: not readable JSON"),
])
def test_a_bad_directory_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 breakage: object, message: str) -> None:
    directory = tiny_checkpoint(tmp_path / "tiny")
    breakage(directory)  # type: ignore[operator]
    with pytest.raises(ModelLoadError, match=None) as refused:
        open_model(directory)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    code, _, err = run(capsys, "generate", "--model", str(directory), "--prompt", "x")
    assert code == 2
    assert_one_line_error(err, message)


def _edit_config(directory: Path, **changes: object) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
