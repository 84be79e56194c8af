"""Configuration: defaults < TOML file < PAGEDSERVE_* environment < flags; unknown keys name themselves."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from service.config.command import add_config_flags, flags_of
from service.config.setting_docs import DOCS, doc_of
from service.config.settings import AppConfig, ConfigError, all_settings, load_config
from service.config.settings_table import settings_table


def parse_flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return flags_of(parser.parse_args(argv))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pagedserve.toml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    config = load_config()
    assert config == AppConfig()
    assert (config.service.host, config.service.port, config.backend.name) == ("127.0.0.1", 8000, "numpy")


def test_every_setting_has_a_unique_public_name() -> None:
    names = [s.name for s in all_settings()]
    assert len(names) == len(set(names)) and "backend" in names and "model" in names


def test_file_layout_and_shortcuts(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend = "sim"\nmodel = "/m.gguf"\n[service]\nport = 9000\napi_keys = ["a", "b"]\n'
                           '[scheduler]\nmax_num_seqs = 8\n[kv]\nblock_size = 32\nenable_prefix_caching = false\n')
    config = load_config(path)
    assert config.backend.name == "sim" and config.backend.model == "/m.gguf"
    assert config.service.port == 9000 and config.service.api_keys == ("a", "b")
    assert config.scheduler.max_num_seqs == 8 and config.kv.block_size == 32
    assert config.kv.enable_prefix_caching is False


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend = "numpy"\n[service]\nport = 9000\nhost = "0.0.0.0"\n'
                           '[scheduler]\nmax_num_seqs = 4\n')
    env = {"PAGEDSERVE_BACKEND": "cupy", "PAGEDSERVE_PORT": "9100", "PAGEDSERVE_MAX_NUM_SEQS": "16"}
    config = load_config(path, env, parse_flags("--backend", "sim", "--port", "9200"))
    assert config.backend.name == "sim"  # flag
    assert config.service.port == 9200  # flag
    assert config.scheduler.max_num_seqs == 16  # env over file
    assert config.service.host == "0.0.0.0"  # file over default


def test_config_file_from_env(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend = "sim"\n')
    assert load_config(None, {"PAGEDSERVE_CONFIG": path}).backend.name == "sim"


def test_flag_kinds() -> None:
    flags = parse_flags("--api-key", "k1", "--api-key", "k2,k3", "--log-prompts", "--no-enable-prefix-caching",
                        "--num-blocks", "64", "--model", "/x.gguf", "--request-timeout-s", "2.5")
    config = load_config(None, {}, flags)
    assert config.service.api_keys == ("k1", "k2", "k3") and config.service.log_prompts is True
    assert config.kv.enable_prefix_caching is False and config.kv.num_blocks == 64
    assert config.backend.model == "/x.gguf" and config.service.request_timeout_s == 2.5


def test_env_kinds() -> None:
    env = {"PAGEDSERVE_LOG_PROMPTS": "yes", "PAGEDSERVE_NUM_BLOCKS": "none", "PAGEDSERVE_API_KEY": "a, b"}
    config = load_config(None, env)
    assert config.service.log_prompts is True and config.kv.num_blocks is None
    assert config.service.api_keys == ("a", "b")


@pytest.mark.parametrize(("text", "named"), [
    ("colour = 1\n", "colour"),
    ("[service]\nprot = 80\n", "prot"),
    ("[engine]\nx = 1\n", "engine"),
    ("[backend]\nbackend = 'sim'\n", "backend"),
])
def test_unknown_file_keys_are_named(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=f"'{named}'"):
        load_config(write(tmp_path, text))


def test_unknown_env_var_is_named() -> None:
    with pytest.raises(ConfigError, match="PAGEDSERVE_MAX_SEQS"):
        load_config(None, {"PAGEDSERVE_MAX_SEQS": "4", "OTHER_VAR": "ignored"})


@pytest.mark.parametrize(("source", "named"), [
    ({"file": "[service]\nport = 'eighty'\n"}, "port"),
    ({"file": "[kv]\nenable_prefix_caching = 1\n"}, "enable_prefix_caching"),
    ({"env": {"PAGEDSERVE_PORT": "eighty"}}, "PAGEDSERVE_PORT"),
    ({"env": {"PAGEDSERVE_LOG_PROMPTS": "maybe"}}, "PAGEDSERVE_LOG_PROMPTS"),
    ({"flag_values": {"max_num_seqs": "lots"}}, "--max-num-seqs"),  # as given to load_config, unparsed
    ({"flags": ("--port", "70000")}, "port"),
    ({"flag_values": {"kv_layout": "sideways"}}, "kv_layout"),
    ({"flags": ("--read-timeout-s", "0")}, "read_timeout_s"),
    ({"env": {"PAGEDSERVE_KEEPALIVE_TIMEOUT_S": "-1"}}, "keepalive_timeout_s"),
    ({"file": "[service]\nmax_headers = 2\n"}, "max_headers"),
    ({"file": "[speculative]\nspeculative_method = 'eagle'\n"}, "speculative_method"),
    ({"flags": ("--num-speculative-tokens", "0")}, "num_speculative_tokens"),
    ({"file": "not toml ["}, "TOML"),
])
def test_bad_values_are_named(tmp_path: Path, source: dict[str, object], named: str) -> None:
    path = write(tmp_path, str(source["file"])) if "file" in source else None
    env = source.get("env") or {}
    flags = parse_flags(*source["flags"]) if "flags" in source else source.get("flag_values", {})  # type: ignore[misc]
    with pytest.raises(ConfigError, match=named):
        load_config(path, env, flags)  # type: ignore[arg-type]


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(str(tmp_path / "absent.toml"))


@pytest.mark.parametrize(("argv", "message"), [
    (("--max-num-seqs", "lots"), "argument --max-num-seqs: expected an integer, got 'lots'"),
    (("--num-blocks", "many"), "argument --num-blocks: expected an integer (or none), got 'many'"),
    (("--log-level", "loud"), "argument --log-level: expected one of debug, info, warning, error, got 'loud'"),
    (("--speculative-method", "medusa"),
     "argument --speculative-method: expected one of off, ngram, draft, got 'medusa'"),
])
def test_flag_values_are_checked_as_they_are_parsed(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                                    message: str) -> None:
    with pytest.raises(SystemExit):
        parse_flags(*argv)
    assert message in capsys.readouterr().err


def test_flags_reach_the_config_as_given() -> None:
    flags = parse_flags("--num-blocks", "none", "--preset", "none", "--sim-model", "", "--log-level", "debug")
    assert flags == {"num_blocks": "none", "preset": "none", "sim_model": "", "log_level": "debug"}
    config = load_config(None, {}, flags)
    assert config.kv.num_blocks is None and config.service.preset is None and config.service.log_level == "debug"


def test_every_setting_is_explained() -> None:
    names = {f"{s.section}.{s.key}" for s in all_settings()}
    assert set(DOCS) == names, "settings without words, or words without a setting"
    assert all(doc_of(s).text for s in all_settings())


def test_every_choice_is_a_valid_value() -> None:
    needs = {"draft": {"PAGEDSERVE_DRAFT_MODEL": "draft.gguf"}}  # a choice valid only with another setting
    for s in all_settings():
        for choice in doc_of(s).choices:
            config = load_config(None, {s.env: choice, **needs.get(choice, {})})
            assert getattr(getattr(config, s.section), s.key) == choice


def test_config_doc_table_is_the_settings_table() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "CONFIG.md").read_text()
    assert settings_table() in doc, "docs/CONFIG.md's table is stale: python -m service.config.settings_table prints it"


@pytest.mark.parametrize("env", [{"PAGEDSERVE_SPECULATIVE_METHOD": "draft"},
                                 {"PAGEDSERVE_DRAFT_MODEL": "draft.gguf"},
                                 {"PAGEDSERVE_SPECULATIVE_METHOD": "ngram", "PAGEDSERVE_DRAFT_MODEL": "draft.gguf"}])
def test_a_draft_model_goes_with_the_draft_method_only(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="speculative_method draft takes its model from draft_model"):
        load_config(None, env)
    both = load_config(None, {"PAGEDSERVE_SPECULATIVE_METHOD": "draft", "PAGEDSERVE_DRAFT_MODEL": "d.gguf"})
    assert both.speculative.draft_model == "d.gguf"
