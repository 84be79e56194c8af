"""`--preset latency|throughput`: scheduler settings just above the defaults, under every explicit setting."""

from __future__ import annotations

import pytest

from service.config.settings import PRESETS, ConfigError, ServiceConfig, load_config


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_sets_its_scheduler_values(name: str) -> None:
    config = load_config(None, {}, {"preset": name})
    for key, value in PRESETS[name].items():
        assert getattr(config.scheduler, key) == value
    assert config.service.preset == name


def test_explicit_settings_override_the_preset() -> None:
    config = load_config(None, {"PAGEDSERVE_PRESET": "throughput", "PAGEDSERVE_MAX_NUM_SEQS": "8"}, {})
    assert config.scheduler.max_num_seqs == 8
    assert config.scheduler.max_num_batched_tokens == PRESETS["throughput"]["max_num_batched_tokens"]
    config = load_config(None, {}, {"preset": "latency", "max_num_batched_tokens": "100"})
    assert config.scheduler.max_num_batched_tokens == 100


def test_unknown_preset_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'fast'"):
        load_config(None, {}, {"preset": "fast"})
    with pytest.raises(ValueError, match="preset"):
        ServiceConfig(preset="fast")
    assert load_config().service.preset is None
