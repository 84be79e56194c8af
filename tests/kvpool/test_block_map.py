"""The block map the dashboard draws (BlockPool.state_map), at the edges the state machine never reaches."""

from kvpool.block_pool import BlockPool


def test_each_state_and_a_block_shared_by_hundreds_of_tables() -> None:
    pool = BlockPool.create(5)
    pool.touch([1, 2, 3])
    pool.touch([2])
    pool.touch([3] * 300)  # a prompt block every one of hundreds of sequences shares: past a byte's range
    pool.register(4, b"hash")  # free, but holding a cached prefix
    assert pool.state_map() == ".ussc"
