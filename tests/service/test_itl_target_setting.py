"""The ITL target setting: "auto" or a number of ms from the file, the environment or a flag; a bad value stops the
server with one line; presets keep their numbers; and a real server's /metrics shows the target in force."""

from __future__ import annotations

import argparse
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from backends.model.loader import ModelFiles
from scheduler.config import AUTO
from scheduler.itl_target import DECODE_MULTIPLE, FLOOR_MS
from service.config.command import ConfigCommand, add_config_flags, config_from, flags_of
from service.config.settings import ConfigError, ServiceConfig, load_config
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, request

GAUGE = "pagedserve:itl_target_seconds"


def parse_flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return flags_of(parser.parse_args(argv))


def test_the_default_is_auto() -> None:
    assert load_config().scheduler.itl_target_ms == AUTO


@pytest.mark.parametrize(("text", "value"), [("auto", AUTO), ("AUTO", AUTO), (" auto ", AUTO), ("0", 0.0),
                                             ("150", 150.0), ("62.5", 62.5)])
def test_flags_and_variables_take_auto_or_a_number(text: str, value: float | str) -> None:
    assert load_config(None, {}, parse_flags("--itl-target-ms", text)).scheduler.itl_target_ms == value
    assert load_config(None, {"PAGEDSERVE_ITL_TARGET_MS": text}).scheduler.itl_target_ms == value


@pytest.mark.parametrize(("toml", "value"), [('"auto"', AUTO), ("120", 120.0), ("87.5", 87.5), ("0", 0.0)])
def test_the_file_takes_auto_or_a_number(tmp_path: Path, toml: str, value: float | str) -> None:
    path = tmp_path / "pagedserve.toml"
    path.write_text(f"[scheduler]\nitl_target_ms = {toml}\n")
    config = load_config(str(path))
    assert config.scheduler.itl_target_ms == value and type(config.scheduler.itl_target_ms) is type(value)


@pytest.mark.parametrize(("source", "message"), [
    ({"env": "fast"}, "PAGEDSERVE_ITL_TARGET_MS: expected auto or a number, got 'fast'"),
    ({"env": "-5"}, "itl_target_ms must be 'auto', 0 (off) or a positive number of ms, not -5.0"),
    ({"env": "nan"}, "itl_target_ms must be 'auto', 0 (off) or a positive number of ms, not nan"),
    ({"flag": "inf"}, "itl_target_ms must be 'auto', 0 (off) or a positive number of ms, not inf"),
    ({"file": '"fast"'}, "[scheduler] itl_target_ms: expected auto or a number, got 'fast'"),
    ({"file": "true"}, "[scheduler] itl_target_ms: expected auto or a number, got True"),
    ({"file": "-1"}, "itl_target_ms must be 'auto', 0 (off) or a positive number of ms, not -1.0"),
])
def test_bad_values_are_refused_naming_the_setting(tmp_path: Path, source: dict[str, str], message: str) -> None:
    path = tmp_path / "pagedserve.toml"
    path.write_text(f"[scheduler]\nitl_target_ms = {source.get('file', 0)}\n")
    env = {"PAGEDSERVE_ITL_TARGET_MS": source["env"]} if "env" in source else {}
    flags = {"itl_target_ms": source["flag"]} if "flag" in source else {}
    with pytest.raises(ConfigError) as refused:
        load_config(str(path) if "file" in source else None, env, flags)
    assert message in str(refused.value)


@pytest.mark.parametrize("value", ["-5", "nan", "fast"])
def test_the_server_refuses_a_bad_value_at_start_up_in_one_line(capsys: pytest.CaptureFixture[str],
                                                                value: str) -> None:
    started: list[object] = []

    def run(args: argparse.Namespace) -> int:
        started.append(config_from(args))  # the server would start with this configuration
        return 0

    command = ConfigCommand(run)
    try:
        status = command.main(["--itl-target-ms", value], "pagedserve serve", "")
    except SystemExit as exc:  # a value that is not a number is argparse's usage error
        status = int(exc.code or 0)
    err = capsys.readouterr().err
    assert status == 2 and not started
    assert [line for line in err.splitlines() if line.startswith(("error:", "pagedserve serve: error:"))] == \
        [next(line for line in err.splitlines() if "itl" in line)]


def test_presets_keep_their_numbers() -> None:
    assert load_config(None, {}, {"preset": "latency"}).scheduler.itl_target_ms == 50.0
    assert load_config(None, {}, {"preset": "throughput"}).scheduler.itl_target_ms == 0.0
    assert load_config(None, {}, {"preset": "latency", "itl_target_ms": "auto"}).scheduler.itl_target_ms == AUTO


def _scraped_target(server: LiveServer) -> float:
    text = request("GET", f"{server.url}/metrics").body.decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(GAUGE + " ")]
    assert len(values) == 1, text
    return values[0]


@pytest.mark.parametrize(("configured", "profile"), [(AUTO, "cpu"), (AUTO, "h200"), (40.0, "cpu"), (0.0, "cpu")])
def test_metrics_show_the_target_in_force(model_files: ModelFiles, caplog: pytest.LogCaptureFixture,
                                          configured: float | str, profile: str) -> None:
    # 256 rows: on the sim's CPU profile a full decode step is then far over the floor's worth
    config = sim_config(ServiceConfig(port=0), profile=profile, itl_target_ms=configured, max_num_seqs=256)
    with caplog.at_level(logging.INFO, logger="service.app.assemble"):
        server = LiveServer.start(config, cached_builder(model_files))
    try:
        at_start = server.call(lambda: server.engine.core.scheduler.itl_target)  # type: ignore[attr-defined]
        assert _scraped_target(server) == pytest.approx(at_start.seconds)  # before any step
        for status in _one_long_and_three_more(server.url):
            assert status == 200
        server.call(lambda: server.state.runtime.telemetry.flush(5.0))  # type: ignore[union-attr]
        limit = server.call(lambda: server.engine.core.scheduler.itl_limit_s)  # type: ignore[attr-defined]
        assert _scraped_target(server) == pytest.approx(limit)  # as the steps left it
    finally:
        server.close()
    assert f"ITL target: {at_start.describe()}" in caplog.text
    if not isinstance(configured, str):  # a number
        assert at_start.ms == configured and limit == configured / 1e3 and not at_start.auto
    else:  # the floor at start; the sim CPU's step of 256 rows predicted far over it (the log's example)
        assert at_start.auto and at_start.ms == FLOOR_MS and limit >= FLOOR_MS / 1e3
        assert (DECODE_MULTIPLE * at_start.decode_step_ms > FLOOR_MS) == (profile == "cpu")


def _one_long_and_three_more(url: str) -> list[int]:
    """Statuses of a long completion and three more beside it: steps that prefill beside decodes."""
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, f"{url}/v1/completions", {"prompt": "Hello there", "max_tokens": 40})
        rest = [pool.submit(post, f"{url}/v1/completions", {"prompt": "Hi " * 40, "max_tokens": 2})
                for _ in range(3)]
        return [f.result().status for f in (first, *rest)]
