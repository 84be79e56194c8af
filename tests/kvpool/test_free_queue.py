from kvpool.free_queue import FreeBlockQueue


def test_lru_order_and_middle_removal() -> None:
    queue = FreeBlockQueue.of(range(5))
    queue.remove(2)
    assert list(queue) == [0, 1, 3, 4]
    assert queue.popleft() == 0
    queue.append(0)
    queue.appendleft(2)
    assert list(queue) == [2, 1, 3, 4, 0]
    assert 2 in queue and 5 not in queue and len(queue) == 5
    assert [queue.popleft() for _ in range(5)] == [2, 1, 3, 4, 0]
