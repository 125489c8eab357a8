"""Lossy block-sparse verify attention (hf_sparse_verify.sparse): selection against a naive definition, output against
masked dense attention, summaries that follow the cache through a whole generate call, equality with plain generate
when the budget keeps every block, calibration files, and the settings' errors."""

from __future__ import annotations

import math
import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_sparse_verify as hsv
from hf_sparse_verify.drivers.calibrate import calibrate
from hf_sparse_verify.kernels.block_summary import build_block_summaries
from hf_sparse_verify.kernels.block_summary.bounds import build_block_bounds
from hf_sparse_verify.sparse import LossySparseVerify, SparseAttention
from hf_sparse_verify.sparse.attention import BlockSparseVerifyAttention, nearest_anchors, row_budget
from hf_sparse_verify.sparse.calibration import SparseCalibration, find_calibration
from hf_sparse_verify.step import StepContext


def _tiny(layers: int = 3, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, max_position_embeddings=4096,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def test_budget_rule_matches_the_paper():
    cfg = SparseAttention(block_size=16, rho=0.25, dense_below=64)
    lengths = torch.tensor([10, 64, 65, 200, 1000])
    expected = [cfg.budget_blocks(int(n)) for n in lengths]
    assert row_budget(cfg, lengths).tolist() == expected
    assert expected[:2] == [1, 4]  # at most dense_below tokens: every block
    assert expected[3] == math.ceil(((200 - 64) * 0.25 + 64) / 16)


def test_nearest_anchors():
    assert nearest_anchors(5, [1, 3]) == [0, 1, 1, 3, 3]


def _setup(batch=2, h=4, h_kv=2, d=16, capacity=160, q_len=4, seed=0):
    torch.manual_seed(seed)
    key = torch.randn(batch, h_kv, capacity, d)
    value = torch.randn(batch, h_kv, capacity, d)
    query = torch.randn(batch, h, q_len, d)
    start = torch.tensor([130, 100])[:batch]
    pad = torch.tensor([0, 21])[:batch]
    step = StepContext("verify", start, pad, q_len=q_len, kv_len=capacity)
    return query, key, value, step.on(query.device)


def _dense_masked(query, key, value, view, allowed):
    """Attention of each query over ``allowed`` [B, H_kv, q, C] & causal/padding."""
    b, h, q_len, d = query.shape
    h_kv, c = key.shape[1], key.shape[2]
    slots = torch.arange(c)
    causal = (slots[None, None, :] <= view.query_slots[:, :, None]) & (
        slots[None, None, :] >= view.pad[:, None, None]
    )
    rep = h // h_kv
    k = key.repeat_interleave(rep, 1)
    v = value.repeat_interleave(rep, 1)
    logits = query @ k.transpose(-1, -2) / math.sqrt(d)
    mask = causal[:, None] & allowed.repeat_interleave(rep, 1)
    logits = logits.masked_fill(~mask, float("-inf"))
    return (logits.softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("score", ["mean", "bounds"])
@pytest.mark.parametrize("schedule", ["shared", "shared_window", "approx_shared", "exact_merged"])
def test_selection_and_output_match_naive_definition(schedule, score):
    bs = 16
    cfg = SparseAttention(
        block_size=bs, rho=0.2, dense_below=32, local_blocks=1, schedule=schedule, group_size=2, score=score
    )
    query, key, value, view = _setup()
    b, h, q_len, d = query.shape
    h_kv, c = key.shape[1], key.shape[2]
    nb = c // bs
    attn = BlockSparseVerifyAttention(cfg, num_layers=1)
    length = view.start + q_len
    build = build_block_bounds if score == "bounds" else build_block_summaries
    attn.mean_key[0] = build(key, view.pad, length, bs)
    out = attn.attend(types.SimpleNamespace(layer_idx=0), query, key, value, view, 1 / math.sqrt(d))

    allowed = torch.zeros(b, h_kv, q_len, c, dtype=torch.bool)
    for row in range(b):
        start, pad = int(view.start[row]), int(view.pad[row])
        first_new, last_new, sink = start // bs, (start + q_len - 1) // bs, pad // bs
        forced = {sink, *range(first_new, last_new + 1)}
        local = {i for i in range(first_new - cfg.local_blocks, first_new) if i > sink}
        keep = cfg.budget_blocks(start + q_len - pad) - (1 + last_new - first_new + 1)
        for g in range(h_kv):
            for i in range(q_len):
                # the verify tokens whose queries score the blocks (their scores averaged)
                reps = {
                    "shared": [0], "shared_window": list(range(q_len)), "approx_shared": [i - i % 2],
                    "exact_merged": [i],
                }[schedule]  # fmt: skip
                blocks = [key[row, g, max(j * bs, pad) : min((j + 1) * bs, start + q_len)] for j in range(nb)]

                def one_score(j, heads, blocks=blocks):
                    if score == "mean":
                        return float(heads.sum(0) @ blocks[j].mean(0))
                    # Quest: per head, sum over channels of the larger of q * min and q * max
                    low, high = blocks[j].amin(0), blocks[j].amax(0)
                    return float(torch.maximum(heads * low, heads * high).sum())

                def block_score(j, reps=reps, row=row, g=g):  # [2, d] per verify token: the GQA group's heads
                    return sum(one_score(j, query[row, g * 2 : g * 2 + 2, t]) for t in reps) / len(reps)

                candidates = [j for j in range(sink, last_new + 1) if j not in forced]
                scored = sorted(candidates, key=lambda j: (j not in local, -block_score(j)))
                chosen = set(scored[: max(keep, 0)]) | forced
                for j in chosen:
                    allowed[row, g, i, j * bs : (j + 1) * bs] = True
    expected = _dense_masked(query, key, value, view, allowed)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # the budget really drops blocks here (otherwise the test would compare dense with dense)
    assert (allowed.sum(-1) < (view.query_slots[:, None, :] + 1 - view.pad[:, None, None])).all()


@pytest.mark.parametrize("score", ["mean", "bounds"])
def test_shared_window_scores_only_the_real_tokens_of_a_short_draft(score):
    """``"shared_window"`` averages the scores of a row's pending token and drafts: the filler after a short draft
    (row 0 drafted 1 of 3 tokens) does not move its selection, so its real tokens' outputs do not change."""
    cfg = SparseAttention(
        block_size=16, rho=0.4, dense_below=32, local_blocks=1, schedule="shared_window", score=score
    )
    query, key, value, view = _setup()
    q_len, d = query.shape[2], query.shape[3]
    module = types.SimpleNamespace(layer_idx=0)
    cache = types.SimpleNamespace(layers=[types.SimpleNamespace(keys=key)])

    def attend(q, told: bool) -> torch.Tensor:
        attn = BlockSparseVerifyAttention(cfg, num_layers=1)
        attn.build(cache, view.pad, view.start + q_len)
        if told:
            attn.drafted(torch.tensor([1, q_len - 1]))
        step = StepContext("verify", view.start, view.pad, q_len=q_len, kv_len=key.shape[2])  # a step of its own
        return attn.attend(module, q, key, value, step.on(q.device), 1 / math.sqrt(d))

    told, untold = attend(query, True), attend(query, False)
    torch.testing.assert_close(told[1], untold[1])  # row 1: every verify token real
    moved = 0
    for seed in range(6):
        filler = query.clone()
        gen = torch.Generator().manual_seed(seed)
        filler[0, :, 2:] = 10 * torch.randn(filler[0, :, 2:].shape, generator=gen)  # other filler
        torch.testing.assert_close(attend(filler, True)[0, :2], told[0, :2])
        moved += not torch.allclose(attend(filler, False)[0, :2], untold[0, :2])
    assert moved, "the test can fail: untold, some filler moves row 0's selection"


def _generate(model, ids, mask, sparse, n=12, strategy="prompt_lookup"):
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False, custom_generate=hsv.generate,
        speculation=dict(strategy=strategy, num_draft_tokens=4, lossy_sparse_verify=sparse),
    )  # fmt: skip


def _batch():
    torch.manual_seed(1)
    ids = torch.randint(0, 100, (2, 140))
    mask = torch.ones_like(ids)
    mask[1, :37] = 0
    return ids, mask


@pytest.mark.parametrize("schedule", ["shared", "shared_window", "approx_shared", "exact_merged"])
def test_whole_budget_equals_plain_generate(schedule):
    """With a budget that keeps every block, sparse verification is dense verification: token-identical (fp32)."""
    model = _tiny()
    ids, mask = _batch()
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    sparse = dict(attention=dict(block_size=16, dense_below=10_000, schedule=schedule))
    assert torch.equal(_generate(model, ids, mask, sparse), expected)


def test_summaries_follow_the_cache_through_rollbacks():
    from hf_sparse_verify.generation.engine import loop

    model = _tiny()
    ids, mask = _batch()
    seen = {}
    original = loop._verify_sparsity

    def spy(*args, **kwargs):
        seen["state"] = original(*args, **kwargs)
        seen["target"] = args[1]
        return seen["state"]

    loop._verify_sparsity = spy
    try:
        out = _generate(model, ids, mask, dict(attention=dict(block_size=16, dense_below=64, rho=0.3)), n=16)
    finally:
        loop._verify_sparsity = original
    attention, cache = seen["state"].attention, seen["target"].cache
    pad = torch.tensor([0, 37])
    # the last verify step wrote up to the final length (rejected drafts past it are masked, not summarised)
    length = torch.full((2,), out.shape[1])
    for layer, mean_key in attention.mean_key.items():
        keys = cache.layers[layer].keys
        fresh = build_block_summaries(keys, pad, length, 16)
        whole = (out.shape[1] - 1) // 16  # blocks wholly before the last step's tokens
        torch.testing.assert_close(mean_key[:, :, :whole], fresh[:, :, :whole], rtol=1e-5, atol=1e-5)


def test_vegas_with_sparse_attention_is_refused():
    model = _tiny()
    ids, mask = _batch()
    with pytest.raises(ValueError, match="strategy='vegas'"):
        _generate(model, ids, mask, dict(attention=dict(block_size=16)), strategy="vegas")


def test_settings_errors_say_what_to_change():
    with pytest.raises(ValueError, match="power of two"):
        SparseAttention(block_size=48)
    with pytest.raises(ValueError, match="schedule"):
        SparseAttention(schedule="merged")
    with pytest.raises(ValueError, match="does nothing"):
        LossySparseVerify(attention=None)
    with pytest.raises(ValueError, match="unknown lossy_sparse_verify.attention"):
        LossySparseVerify(attention={"rh0": 0.1})
    with pytest.raises(ValueError, match="lossy_sparse_verify must be"):
        hsv.SpeculationConfig(lossy_sparse_verify="sparse")
    model = _tiny()
    ids, mask = _batch()
    with pytest.raises(ValueError, match="hf-sparse-verify calibrate"):
        _generate(model, ids, mask, dict(attention=dict(block_size=16, reuse=True)))


def test_calibration_anchors_round_trip_and_reuse(tmp_path):
    model = _tiny(layers=4)
    torch.manual_seed(3)
    prompts = [torch.randint(0, 100, (n,)) for n in (100, 130)]
    cfg = LossySparseVerify(attention=SparseAttention(block_size=16, dense_below=32, rho=0.2, anchors=2))
    calibration = calibrate(model, prompts, cfg, verify_tokens=4, progress=False)
    similarity = calibration.attention["similarity"]
    assert similarity[0] == 0 and all(0 <= s <= 1 for s in similarity)
    anchors = calibration.anchor_layers(cfg.attention)
    assert len(anchors) == 2 and anchors[0] == 0
    path = calibration.save(tmp_path)
    loaded = SparseCalibration.load(path)
    assert loaded == calibration and SparseCalibration.load(tmp_path) == calibration
    # found in the model's folder, then used for reuse: the non-anchor layers keep no summaries
    model.config._name_or_path = str(tmp_path)
    reuse = LossySparseVerify(attention=SparseAttention(block_size=16, dense_below=32, reuse=True, anchors=2))
    assert find_calibration(reuse, model) == calibration
    ids, mask = _batch()
    out = _generate(model, ids, mask, reuse.to_dict())
    assert out.shape == (2, 152)
    wrong = SparseCalibration("llama", 7, attention=calibration.attention)
    wrong.save(tmp_path)
    with pytest.raises(ValueError, match="recalibrate"):
        find_calibration(reuse, model)


def test_summaries_are_rebuilt_in_place_for_captured_graphs():
    """A session's captured verify graphs read the mean-key tensors: a later call's prefill must refill them."""
    query, key, value, view = _setup()
    cfg = SparseAttention(block_size=16)
    attn = BlockSparseVerifyAttention(cfg, num_layers=1)
    cache = types.SimpleNamespace(layers=[types.SimpleNamespace(keys=key)])
    length = torch.tensor([140, 140])
    attn.build(cache, view.pad, length)
    first = attn.mean_key[0]
    key.normal_()
    attn.build(cache, view.pad, length)
    assert attn.mean_key[0] is first
    torch.testing.assert_close(first, build_block_summaries(key, view.pad, length, 16))
