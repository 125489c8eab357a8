"""The local-shard modules of tensor-parallel models (`hf_sparse_verify.integrations.tensor_parallel`), in one
process: weights sharded as transformers shards them, over a one-rank gloo mesh (so every shard is whole), put on
their local shards by `speculation_mode` and back after it; which sharded modules are covered and why not. The
two-rank arithmetic (partial sums all-reduced, vocabulary pieces gathered) is checked end to end by
``tests/test_placement.py::test_tensor_parallel_greedy_equals_plain`` under ``torchrun``."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from conftest import make_model

from hf_sparse_verify.integrations import Mode, speculation_mode
from hf_sparse_verify.integrations.tensor_parallel import (
    GatherLinear,
    ReduceOutput,
    VocabShardEmbedding,
    local_shard_swaps,
)
from hf_sparse_verify.placement import dtensor_weights, graph_obstacle, tensor_parallel

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch built without torch.distributed")

#: transformers' tensor-parallel plan for Llama-family models (5.24: ``_tp_plan`` with the embedding and head)
PLAN = {
    "q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 0, "up_proj": 0, "down_proj": 1,
    "embed_tokens": 0, "lm_head": 0,
}  # fmt: skip


@pytest.fixture(scope="module")
def mesh():
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def _shard(model, mesh, plan=PLAN):
    from torch.distributed.tensor import Shard, distribute_tensor

    for name, module in model.named_modules():
        dim = plan.get(name.rsplit(".", 1)[-1])
        if dim is not None:
            module.weight = torch.nn.Parameter(distribute_tensor(module.weight.data, mesh, [Shard(dim)]))
    return model


def test_a_model_without_dtensor_weights_needs_no_swaps():
    assert local_shard_swaps(make_model("llama")) == ([], None)


@torch.no_grad()
def test_sharded_llama_runs_on_local_shards_and_is_put_back(mesh):
    model = make_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    expected = model(ids).logits
    _shard(model, mesh)
    assert dtensor_weights(model) and graph_obstacle(model) is not None
    layer = model.model.layers[0]
    originals = (layer.self_attn, layer.mlp, model.model.embed_tokens, model.lm_head, layer.self_attn.q_proj)
    with speculation_mode(model, mode=Mode(attention=False)) as switched:
        assert switched.counts["ReduceOutput"] == 2 * model.config.num_hidden_layers
        assert isinstance(layer.self_attn, ReduceOutput) and isinstance(layer.mlp, ReduceOutput)
        assert isinstance(model.model.embed_tokens, VocabShardEmbedding)
        assert isinstance(model.lm_head, GatherLinear)
        assert type(layer.self_attn.module.q_proj) is torch.nn.Linear  # a plain Linear: fused modules take it
        assert not dtensor_weights(model) and tensor_parallel(model)  # still sharded, for RankAgreement
        assert graph_obstacle(model) is None
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert (
        layer.self_attn,
        layer.mlp,
        model.model.embed_tokens,
        model.lm_head,
        layer.self_attn.q_proj,
    ) == originals
    assert dtensor_weights(model)


def test_uncovered_sharded_modules_keep_transformers_modules(mesh):
    model = _shard(make_model("llama", mlp_bias=True), mesh, {**PLAN, "up_proj": None})
    swaps, reason = local_shard_swaps(model)
    assert swaps == [] and "gate_proj" in reason  # an MLP with biases is not ours to replace
    with speculation_mode(model, mode=Mode(attention=False)) as switched:
        assert "ReduceOutput" not in switched.counts
        assert dtensor_weights(model)


def test_lossy_sparse_ffn_is_refused_on_local_shards_too(mesh):
    """Its channel calibration is per whole MLP channel: on a rank's shard of the channels it would be wrong."""
    model = _shard(make_model("llama"), mesh)
    with pytest.raises(ValueError, match="sparse FFN"):
        with speculation_mode(model, mode=Mode(attention=False, sparse_ffn=True)):
            pass
    assert dtensor_weights(model)  # the local shards were put back
