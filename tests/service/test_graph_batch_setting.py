"""The server hands the backend a decode-graph maximum no larger than a step's sequences can be."""

from __future__ import annotations

from service.app.assemble import backend_config
from service.config.settings import load_config


def test_the_largest_graph_bucket_is_at_most_max_num_seqs() -> None:
    assert backend_config(load_config(env={"PAGEDSERVE_MAX_NUM_SEQS": "40"})).cuda_graph_max_batch == 40
    config = load_config(env={"PAGEDSERVE_MAX_NUM_SEQS": "512", "PAGEDSERVE_CUDA_GRAPH_MAX_BATCH": "128"})
    assert backend_config(config).cuda_graph_max_batch == 128
    assert backend_config(config).cuda_graphs == "eager" and config.backend.cuda_graph_max_batch == 128
