import pytest

from kvpool import (
    ContiguousKVCacheManager,
    KVPoolConfig,
    KVSpec,
    PagedKVCacheManager,
    kv_cache_manager_from_config,
    new_kv_cache_manager,
    parse_size,
)

SMOLLM2 = KVSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=4, block_size=16)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1000", 1000),
        ("64 KiB", 65536),
        ("3kb", 3000),
        ("10B", 10),
        (" 1TiB ", 2**40),
        ("0.5KiB", 512),
        (".5k", 500),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("junk", ["", "GiB", "2 GiBs", "-1GiB", "1e9", "two", "1.2.3MB", "nan", "1 2"])
def test_parse_size_rejects_junk(junk: str) -> None:
    with pytest.raises(ValueError):
        parse_size(junk)


def test_kvspec_bytes_and_blocks() -> None:
    assert SMOLLM2.bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46_080
    assert SMOLLM2.bytes_per_block == 46_080 * 16
    assert SMOLLM2.num_blocks_for(parse_size("2GiB")) == 2**31 // 737_280 == 2912
    assert SMOLLM2.num_blocks_for(737_279) == 0


def test_kvspec_validates() -> None:
    with pytest.raises(ValueError):
        KVSpec(num_layers=0, num_kv_heads=3, head_dim=64, dtype_bytes=4)
    with pytest.raises(ValueError):
        SMOLLM2.num_blocks_for(-1)


@pytest.mark.parametrize(
    "kwargs",
    [{"kv_layout": "ragged"}, {"block_size": 0}, {"num_blocks": 0}, {"kv_cache_memory": "lots"}],
)
def test_config_validates(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        KVPoolConfig(**kwargs)  # type: ignore[arg-type]


def test_from_config_uses_memory_budget() -> None:
    manager = kv_cache_manager_from_config(KVPoolConfig(kv_cache_memory="2GiB"), SMOLLM2, max_model_len=8192)
    assert (manager.num_blocks, manager.block_size) == (2912, 16)
    assert isinstance(manager, PagedKVCacheManager)
    manager.allocate(1, list(range(33)), 33)
    assert manager.num_cached_tokens(list(range(33))) == 32  # prefix caching is on by default


def test_from_config_num_blocks_overrides_budget() -> None:
    config = KVPoolConfig(num_blocks=100, enable_prefix_caching=False, kv_layout="contiguous")
    manager = kv_cache_manager_from_config(config, SMOLLM2, max_model_len=1024)
    assert manager.num_blocks == 100
    assert isinstance(manager, ContiguousKVCacheManager)
    manager.allocate(1, [1], 1)
    assert manager.stats().free_blocks == 100 - 1024 // 16  # max_model_len reserved


def test_from_config_rejects_block_size_mismatch() -> None:
    with pytest.raises(ValueError):
        kv_cache_manager_from_config(KVPoolConfig(block_size=32), SMOLLM2, max_model_len=8192)


def test_caches_validate_arguments() -> None:
    with pytest.raises(ValueError):
        PagedKVCacheManager(0, 16)
    with pytest.raises(ValueError):
        PagedKVCacheManager(8, 0)
    with pytest.raises(ValueError):
        new_kv_cache_manager("ragged", 8, 16, max_model_len=128)
    with pytest.raises(ValueError):
        ContiguousKVCacheManager(8, 16, max_model_len=0)
    with pytest.raises(ValueError):  # one contiguous sequence would not fit
        ContiguousKVCacheManager(8, 16, max_model_len=8 * 16 + 1)
