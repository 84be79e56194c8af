"""The request stream's per-token path gives readers what the merging of whole deltas gave them."""

from __future__ import annotations

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import create
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.llm import LLM
from scheduler.outputs import ChoiceDelta, RequestStream, TokenLogprob
from scheduler.params import SamplingParams


def test_tokens_added_then_published_read_as_merged_deltas() -> None:
    by_token, by_delta = RequestStream("r", 3), RequestStream("r", 3)
    lp = TokenLogprob(7, -0.5)
    steps = [(0, "Hel", 7, lp), (1, "A", 8, None), (0, "lo", 9, lp)]
    for index, text, token, logprob in steps:
        by_token.add_token(index, text, token, logprob)
        by_delta.put(ChoiceDelta(index, text, [token], [logprob] if logprob else None), 3)
    by_token.end_choice(1, "stop", "A")
    by_delta.put(ChoiceDelta(1, finish_reason="stop", stop_reason="A"), 3)
    by_token.publish(3)
    for stream in (by_token, by_delta):
        stream.finish()
    assert by_token.take_finished() == by_delta.take_finished()


def test_publish_wakes_the_reader_once_per_step() -> None:
    stream = RequestStream("r", 1)
    stream.add_token(0, "a", 1, None)
    assert not stream._ready.is_set()  # added, not yet published
    stream.publish(1)
    assert stream._ready.is_set()


def test_usage_counts_every_choice_token(files: ModelFiles) -> None:
    """completion_tokens is counted per step as tokens are emitted: it must equal the choices' tokens."""
    backend = create(BackendConfig(name="sim", sim_profile="zero", sim_clock="virtual"), files)
    backend.init_cache(64, 16)
    llm = LLM(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), PagedKVCacheManager(64, 16), backend,
              files.tokenizer, max_model_len=512)
    params = SamplingParams(temperature=0.9, seed=3, n=3, max_tokens=12, logprobs=True, stop=("e",))
    outs = llm.generate([[1000 + i for i in range(40)], [2000 + i for i in range(9)]], params)
    for out in outs:
        assert out.finished and out.completion_tokens == sum(len(c.token_ids) for c in out.choices) > 0
        assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in out.choices)
