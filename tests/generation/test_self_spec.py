"""Self-speculative drafting (``vegas``, ``streaming``, ``quest``): greedy output equals plain generation while the
draft attention is really sparse, sparsity 0 reproduces dense attention, the selection functions and the verify
pass's score collection match brute-force references, sampling keeps the target's distribution, and bad
configurations fail with a message naming the field."""

from __future__ import annotations

import functools
import json
import math
import types
from fractions import Fraction

import pytest
import torch
from conftest import PAD, make_model, ragged_batch
from test_verify import E2E_ROWS, E2E_VOCAB, _joint_next_tokens, _joint_pvalue, e2e_model

import hf_sparse_verify as hsv
from hf_sparse_verify.attention import interface
from hf_sparse_verify.attention.eager import PLAIN, _attention_with_logits, reference_attention
from hf_sparse_verify.attention.scores import reduce_scores
from hf_sparse_verify.config import SpeculationConfig
from hf_sparse_verify.generation.drafters.self_spec import SelfSpecDrafter
from hf_sparse_verify.generation.drafters.self_spec.selection import (
    IndexSelection,
    QuestSelection,
    budget,
    kept_counts,
    page_summaries,
    pool_scores,
    select_quest,
    streaming_index,
    topk_index,
)
from hf_sparse_verify.generation.engine import loop
from hf_sparse_verify.registry import DRAFTERS, resolve
from hf_sparse_verify.step import Phase, ScoreCollection, StepContext

PREFILL_SEED_ROWS = ScoreCollection.PREFILL_SEED_ROWS

PROMPT_LEN, MAX_NEW = 40, 24
SPARSE = dict(ratio=0.2, min_tokens=4)  # budget 8 of a ~40-token prefix
STRATEGIES = {
    "vegas": dict(strategy="vegas"),
    "vegas-all": dict(strategy="vegas", selection="all"),
    "vegas-last_token": dict(strategy="vegas", selection="last_token"),
    "vegas-carried": dict(strategy="vegas", vegas_lse="carried"),
    "vegas-all-step": dict(strategy="vegas", selection="all", vegas_lse="step"),
    "streaming": dict(strategy="streaming"),
    "quest": dict(strategy="quest", quest_page_size=4),
}


# ------------------------------------------------------------------------------------------------------- helpers
def _expected_budget(n: int, ratio: float, min_tokens: int) -> int:
    """``max(min_tokens, ceil(ratio * n))`` in exact arithmetic (the ratio as written in decimal)."""
    return max(min_tokens, math.ceil(Fraction(str(ratio)) * n))


@functools.cache
def _model(arch: str) -> torch.nn.Module:
    return make_model(arch)


@functools.cache
def _plain(arch: str, batch: int) -> torch.Tensor:
    ids, mask = ragged_batch(batch, PROMPT_LEN)
    return _model(arch).generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)


def _speculate(model, ids, mask, k: int, max_new: int = MAX_NEW, do_sample: bool = False, **speculation):
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new,
        do_sample=do_sample,
        custom_generate=hsv.generate,
        speculation=dict(num_draft_tokens=k, **speculation),
        return_dict_in_generate=True,
    )


def _spy_selections(monkeypatch) -> list[dict]:
    """Record every `SelfSpecDrafter._update` call (the device-side selection over all layers): the scores it
    read and the selection it made, as slot sets per layer and row."""
    calls: list[dict] = []
    original = SelfSpecDrafter._update

    def spy(self):
        layers = len(self.target.cache.layers)
        capacity = self.target.cache.capacity
        scores = None
        if self.buffers.collection is not None:
            scores = [self._layer_scores([layer], capacity)[0].clone() for layer in range(layers)]
        original(self)
        pads = self.target.pad_t.tolist()
        prefix_end = self.buffers.recent_src.tolist()
        prefix = [max(0, e - p) for e, p in zip(prefix_end, pads)]
        selection = self.buffers.selection
        selected = pages = None
        if isinstance(selection, IndexSelection):
            selected = []
            for layer in range(layers):
                index, count = selection.gather_index(layer)
                selected.append([set(index[row, : int(count[row])].tolist()) for row in range(len(pads))])
                assert selection.recent_start(layer).tolist() == prefix_end
        else:
            pages = [selection.pages.layer(layer).tolist() for layer in range(layers)]
        calls.append(
            dict(
                seed=len(calls) == 0,
                accepted=self.buffers.accepted_src.tolist(),
                pad=pads,
                prefix_end=prefix_end,
                prefix=prefix,
                budgets=[_expected_budget(n, self.ratio, self.min_tokens) for n in prefix],
                scores=scores,
                selected=selected,
                quest_pages=pages,
                page_size=self.page_size,
            )
        )

    monkeypatch.setattr(SelfSpecDrafter, "_update", spy)
    return calls


def _assert_sparse(calls: list[dict], strategy: str) -> None:
    """Every selection keeps ``min(budget, prefix)`` prefix slots per row (pages enough for them, for Quest),
    and at least one row of one call keeps fewer than its prefix (the draft attention really was sparse)."""
    assert calls and calls[0]["seed"], "the prefill must seed the first selection"
    sparse_rows = 0
    for call in calls:
        kept = [min(n, b) for n, b in zip(call["prefix"], call["budgets"])]
        if strategy == "quest":
            size = call["page_size"]
            want = [
                math.ceil(end / size) - pad // size
                if k == n
                else math.ceil(k / size)  # dense: every page it overlaps
                for k, n, pad, end in zip(kept, call["prefix"], call["pad"], call["prefix_end"])
            ]
            for pages in call["quest_pages"]:
                assert pages == want
        else:
            for layer, rows in enumerate(call["selected"]):
                for row, (pad, end) in enumerate(zip(call["pad"], call["prefix_end"])):
                    assert all(pad <= slot < end for slot in rows[row]), (layer, row)
                    assert len(rows[row]) == kept[row], (layer, row)
        sparse_rows += sum(n > b for n, b in zip(call["prefix"], call["budgets"]))
    assert sparse_rows > 0, "no selection was sparse: lengthen the prompt or lower the ratio"


def _brute_logits(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """``[B, H, q, L]`` float64 ``q . k * scale``, each KV head repeated for its ``H / H_kv`` query heads."""
    group = query.shape[1] // key.shape[1]
    keys = key.double().repeat_interleave(group, dim=1)
    return torch.einsum("bhqd,bhld->bhql", query.double(), keys) * scaling


def _brute_topk(scores: torch.Tensor, lo: int, hi: int, k: int, recent_share: float = 0.0) -> set[int]:
    """The ``k`` slots of ``[lo, hi)`` with the highest ``scores`` ``[L]`` (all of them when fewer), of which the
    last ``round(recent_share * k)`` slots of the range are always part."""
    k = min(k, hi - lo)
    window = int(torch.round(torch.tensor(k * recent_share, dtype=torch.float64)))
    kept = set(range(hi - window, hi))
    order = sorted(range(lo, hi - window), key=lambda j: float(scores[j]), reverse=True)
    return kept | set(order[: k - window])


def _brute_pool(scores: torch.Tensor, lo: int, hi: int, pool: int) -> list[float]:
    """Per slot of ``[lo, hi)``: the highest score within ``pool // 2`` slots of the range either side."""
    half = pool // 2
    return [float(scores[max(lo, j - half) : min(hi, j + half + 1)].max()) for j in range(lo, hi)]


def _check_pooled_topk(
    selected: set[int], scores: torch.Tensor, lo: int, hi: int, k: int, recent_share: float, pool: int
) -> None:
    """``selected`` is a top-k of ``[lo, hi)`` by pooled score beside the recent window. Pooling makes ties (a span
    shares its peak), so the kept slots' pooled scores are compared with the best ones, not the slots."""
    k = min(k, hi - lo)
    window = int(torch.round(torch.tensor(k * recent_share, dtype=torch.float64)))
    pooled = _brute_pool(scores, lo, hi, pool)
    assert len(selected) == k and all(lo <= j < hi for j in selected)
    assert set(range(hi - window, hi)) <= selected
    got = sorted((pooled[j - lo] for j in selected if j < hi - window), reverse=True)
    want = sorted(pooled[: hi - window - lo], reverse=True)[: k - window]
    assert got == pytest.approx(want, rel=1e-6, abs=0)


def _assert_topk(
    selected: set[int], scores, lo: int, hi: int, k: int, recent_share: float, pool: int
) -> None:
    if pool == 1:
        assert selected == _brute_topk(scores, lo, hi, k, recent_share)
    else:
        _check_pooled_topk(selected, scores, lo, hi, k, recent_share, pool)


def _slots(mask_row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(mask_row).flatten().tolist())


# ----------------------------------------------------------------------------------------- lossless greedy output
_CASES = [
    pytest.param(arch, batch, k, "vegas", id=f"{arch}-b{batch}-k{k}-vegas")
    for arch in ("llama", "qwen3", "qwen3_moe")
    for batch in (1, 3)
    for k in (1, 4, 8)
] + [
    pytest.param(arch, batch, k, name, id=f"{arch}-b{batch}-k{k}-{name}")
    for name in STRATEGIES
    if name != "vegas"
    for arch, batch, k in (("llama", 3, 4), ("qwen3_moe", 1, 8))
]


@pytest.mark.parametrize("arch, batch, k, name", _CASES)
def test_greedy_equals_plain_generate(monkeypatch, arch, batch, k, name):
    """Token-for-token equal to plain greedy generation, with every selection keeping 8 of ~40 prefix tokens."""
    calls = _spy_selections(monkeypatch)
    ids, mask = ragged_batch(batch, PROMPT_LEN)
    out = _speculate(_model(arch), ids, mask, k, **STRATEGIES[name], **SPARSE)
    assert torch.equal(out.sequences, _plain(arch, batch))
    assert out.speculation.strategy == STRATEGIES[name]["strategy"]
    assert max(out.speculation.draft_tokens) == k
    _assert_sparse(calls, STRATEGIES[name]["strategy"])
    # the prefill seed, then one selection per verify step; vegas and streaming skip plain steps (they keep the
    # selection: `idle_at_k0`), and the last step of a call drafts nothing when one token is left
    idle = STRATEGIES[name]["strategy"] in ("vegas", "streaming")
    updates = sum(k > 0 for k in out.speculation.draft_tokens) if idle else out.speculation.steps
    assert len(calls) == 1 + updates


@pytest.fixture(scope="module")
def code_target(shared_models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(shared_models / "code-target", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(shared_models / "code-target")
    texts = [json.loads(line) for line in open(shared_models / "prompts.jsonl", encoding="utf-8")]
    texts = [t["text"] for t in texts if t["len"] == 2048]
    return model, [tok(t, return_tensors="pt").input_ids[0] for t in texts[:3]]


@pytest.mark.fixtures
@pytest.mark.parametrize("batch", [1, 3])
def test_trained_target_greedy_with_paper_defaults(monkeypatch, code_target, batch):
    """Held-out 2K-token prompts (ragged by truncation), ratio 0.07 / min_tokens 256: lossless, sparse, and the
    trained model's peaky attention keeps most drafts."""
    model, prompts = code_target
    rows = [p[: 2048 - 160 * i] for i, p in enumerate(prompts[:batch])]
    width = max(len(r) for r in rows)
    ids = torch.full((batch, width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = row
        mask[b, width - len(row) :] = 1
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32, do_sample=False)
    calls = _spy_selections(monkeypatch)
    out = _speculate(model, ids, mask, 4, max_new=32, strategy="vegas")
    assert torch.equal(out.sequences, expected)
    _assert_sparse(calls, "vegas")
    assert max(calls[0]["budgets"]) == 256 < min(calls[0]["prefix"])
    assert out.speculation.mean_acceptance_length > 2.0, out.speculation.summary()


# ------------------------------------------------------------------------------------------- sparsity 0 is dense
@pytest.mark.parametrize("name", ["vegas", "streaming", "quest"])
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_ratio_one_drafts_with_dense_attention(monkeypatch, arch, name):
    """ratio = 1 keeps every prefix token: the drafts are the target's own greedy tokens, so every draft is
    accepted; the same call with ratio 0.2 rejects some (so the selection is what made the difference)."""
    model = _model(arch)
    ids, mask = ragged_batch(3, PROMPT_LEN)
    calls = _spy_selections(monkeypatch)
    out = _speculate(model, ids, mask, 4, **STRATEGIES[name], ratio=1.0, min_tokens=1)
    assert torch.equal(out.sequences, _plain(arch, 3))
    for call in calls:  # every selection is the whole prefix
        if call["selected"] is not None:
            for rows in call["selected"]:
                assert [len(r) for r in rows] == call["prefix"]
    stats = out.speculation
    for k, row in zip(stats.draft_tokens, stats.accepted_tokens):
        assert all(a == k for a in row if a is not None), (k, row)  # k shrinks only where the length ran out
    assert stats.mean_acceptance_length > 4.0

    sparse = _speculate(model, ids, mask, 4, **STRATEGIES[name], **SPARSE).speculation
    assert any(
        a < k for k, row in zip(sparse.draft_tokens, sparse.accepted_tokens) for a in row if a is not None
    )


def _draft_case(ragged: bool, seed: int = 0):
    """Random q/k/v of one draft step: ``[B, H, 1, D]`` queries over a ``[B, H_kv, 32, D]`` cache."""
    gen = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, dim, capacity = 3, 4, 2, 8, 32
    pad = [0, 3, 6] if ragged else [0, 0, 0]
    start = [20, 19, 17] if ragged else [20, 20, 20]
    recent = [16, 18, 14] if ragged else [16, 16, 16]  # slots >= recent: drafts appended since the selection
    query = torch.randn(batch, heads, 1, dim, generator=gen)
    key = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    value = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    return query, key, value, pad, start, recent, capacity


class _MaskSelection(IndexSelection):
    """A selection given as a ``[B, C]`` mask, in index form."""

    def __init__(self, selected: torch.Tensor, recent: list[int]):
        batch, capacity = selected.shape
        super().__init__([torch.device("cpu")], batch, capacity)
        count = selected.sum(dim=1)
        order = torch.where(selected, torch.arange(capacity), capacity).sort(dim=1).values
        self.index.layer(0).copy_(torch.where(order < capacity, order, 0))
        self.count.layer(0).copy_(count)
        self.recent.layer(0).copy_(torch.tensor(recent))
        self.recent_min = min(recent)


def _run_reference(query, key, value, pad, start, phase, selection=None, scores=None):
    step = StepContext(
        phase,
        torch.tensor(start),
        torch.tensor(pad),
        q_len=query.shape[2],
        kv_len=max(start) + query.shape[2],
        no_padding=max(pad) == 0,
        uniform_start=len(set(start)) == 1,
        kv_selection=selection,
        scores=scores,
    )
    module = types.SimpleNamespace(layer_idx=0)
    return reference_attention(module, query, key, value, step.on(query.device), scaling=0.35)


@pytest.mark.parametrize("ragged", [True, False], ids=["ragged", "unpadded"])
@pytest.mark.parametrize("policy", ["topk", "quest"])
def test_draft_attention_with_full_selection_equals_dense(ragged, policy):
    """A selection covering every prefix slot (in index form, or Quest with pages for the whole prefix) gives
    bit-identical draft attention to no selection at all; one missing slot changes that row only."""
    query, key, value, pad, start, recent, capacity = _draft_case(ragged)
    dense = _run_reference(query, key, value, pad, start, "draft")
    slots = torch.arange(capacity)[None, :]
    full = (slots >= torch.tensor(pad)[:, None]) & (slots < torch.tensor(recent)[:, None])
    if policy == "topk":
        got = _run_reference(query, key, value, pad, start, "draft", _MaskSelection(full, recent))
        assert torch.equal(got, dense)
        holed = full.clone()
        holed[1, 10] = False
        out = _run_reference(query, key, value, pad, start, "draft", _MaskSelection(holed, recent))
        assert not torch.allclose(out[1], dense[1]) and torch.equal(out[[0, 2]], dense[[0, 2]])
    else:
        quest = QuestSelection([torch.device("cpu")], 3, page_size=4, pages_max=capacity // 4, window_pages=2)
        quest.recent.layer(0).copy_(torch.tensor(recent))
        quest.pages.layer(0).fill_(capacity // 4)
        quest.refresh(0, key, torch.tensor(pad))
        assert torch.equal(_run_reference(query, key, value, pad, start, "draft", quest), dense)


def _brute_scores(query, key, pad, start, scaling, rows, weights, per_kv_head=False):
    """``[B, (H_kv,) L]`` (float64): head and row mean of raw logits or of softmax weights, brute force."""
    logits = _brute_logits(query, key, scaling)  # [B, H, q, L]
    length = key.shape[2]
    own = torch.tensor(start)[:, None] + torch.arange(query.shape[2])  # [B, q]
    slots = torch.arange(length)
    mask = ((slots <= own[..., None]) & (slots >= torch.tensor(pad)[:, None, None])) | (
        slots == own[..., None]
    )
    values = torch.softmax(logits.masked_fill(~mask[:, None], float("-inf")), -1) if weights else logits
    values = values[:, :, rows].mean(dim=2)  # [B, H, L]
    if per_kv_head:
        return values.view(values.shape[0], key.shape[1], -1, length).mean(dim=2)
    return values.mean(dim=1)


@pytest.mark.parametrize("rows", ["two_rows", "all_rows", "per_row"])
@pytest.mark.parametrize("weights", [True, False], ids=["weights", "logits"])
def test_verify_collects_scores_without_changing_output(rows, weights):
    """Collecting scores in a verify pass leaves its output unchanged (to float rounding) and stores the head
    mean of the softmax weights (or raw logits) of the rows the collection names, over every slot below
    ``kv_len``."""
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(3, 4, 5, 8, generator=gen)  # 5 verify rows
    key = torch.randn(3, 2, 32, 8, generator=gen)
    value = torch.randn(3, 2, 32, 8, generator=gen)
    pad, start = [0, 3, 6], [20, 19, 17]
    dense = _run_reference(query, key, value, pad, start, "verify")
    collection = ScoreCollection(rows, weights=weights)
    out = _run_reference(query, key, value, pad, start, "verify", scores=collection)
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)
    keys = key[:, :, : max(start) + 5]
    if rows == "per_row":
        want = torch.stack([_brute_scores(query, keys, pad, start, 0.35, [i], weights) for i in range(5)], 1)
    else:
        want = _brute_scores(
            query, keys, pad, start, 0.35, [0, 4] if rows == "two_rows" else list(range(5)), weights
        )
    torch.testing.assert_close(collection.layer(0).double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", ["two_rows", "all_rows"])
def test_verify_scores_with_a_carried_lse(rows):
    """``lse="carried"``: a verify pass scores by ``exp(logit - carried[b, h])`` (head and row mean over the
    collected rows), leaves its output unchanged and then carries its first row's log-sum-exp."""
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(3, 4, 5, 8, generator=gen)  # 5 verify rows
    key = torch.randn(3, 2, 32, 8, generator=gen)
    value = torch.randn(3, 2, 32, 8, generator=gen)
    pad, start = [0, 3, 6], [20, 19, 17]
    collection = ScoreCollection(rows, weights=True, lse="carried")
    carried = torch.randn(3, 4, generator=gen)
    collection.carry(0, carried.clone())
    kept = collection.carried_lse(0)
    out = _run_reference(query, key, value, pad, start, "verify", scores=collection)
    torch.testing.assert_close(
        out, _run_reference(query, key, value, pad, start, "verify"), atol=1e-5, rtol=1e-5
    )
    keys = key[:, :, : max(start) + 5]
    logits = _brute_logits(query, keys, 0.35)  # [B, H, q, L]
    own = torch.tensor(start)[:, None] + torch.arange(5)
    slots = torch.arange(keys.shape[2])
    mask = ((slots <= own[..., None]) & (slots >= torch.tensor(pad)[:, None, None])) | (
        slots == own[..., None]
    )
    masked = logits.masked_fill(~mask[:, None], float("-inf"))
    chosen = [0, 4] if rows == "two_rows" else list(range(5))
    want = torch.exp(masked[:, :, chosen] - carried.double()[:, :, None, None]).mean(dim=(1, 2))
    torch.testing.assert_close(collection.layer(0).double(), want, atol=1e-5, rtol=1e-5)
    assert collection.carried_lse(0) is kept  # updated in place (captured steps read the same tensor)
    torch.testing.assert_close(kept.double(), torch.logsumexp(masked[:, :, 0], dim=-1), atol=1e-5, rtol=1e-5)


def test_carried_lse_config_errors():
    with pytest.raises(ValueError, match="needs vegas_scores='weights'"):
        SpeculationConfig(strategy="vegas", vegas_lse="carried", vegas_scores="logits")
    with pytest.raises(ValueError, match="selection 'two_rows' or 'all'"):
        SpeculationConfig(strategy="vegas", vegas_lse="carried", selection="last_token")
    with pytest.raises(ValueError, match="unknown vegas_lse 'last'"):
        SpeculationConfig(strategy="vegas", vegas_lse="last")
    with pytest.raises(ValueError, match="lse must be one of"):
        ScoreCollection("two_rows", lse="exact")
    with pytest.raises(RuntimeError, match="no carried log-sum-exp for layer 2"):
        ScoreCollection("two_rows", lse="carried").carried_lse(2)


def test_weight_scores_per_kv_head():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 6, 3, 10, generator=gen)
    mask = torch.rand(2, 1, 3, 10, generator=gen) > 0.3
    mask[..., 0] = True
    weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1).mean(dim=2)  # [B, H, L]
    got = reduce_scores(logits, mask, ScoreCollection("all_rows", weights=True, per_kv_head=True), kv_heads=2)
    torch.testing.assert_close(got, weights.view(2, 2, 3, 10).mean(dim=2))
    shared = reduce_scores(logits, mask, ScoreCollection("all_rows", weights=True), kv_heads=2)
    torch.testing.assert_close(shared, weights.mean(dim=1))


# ----------------------------------------------------------------------------------- selection vs brute force
@pytest.mark.parametrize(
    "n, ratio, min_tokens",
    [
        (1000, 0.07, 1),
        (2048, 0.07, 256),
        (8192, 0.07, 256),
        (4097, 0.5, 1),
        (40, 0.2, 4),
        (7, 1.0, 1),
        (3, 0.9, 1),
        (0, 0.3, 5),
        (100, 0.07, 1),  # 0.07 * 100 is 7.000000000000001 in floats
        (1200, 0.07, 1),
    ],
)
def test_budget_formula(n, ratio, min_tokens):
    assert budget(n, ratio, min_tokens) == _expected_budget(n, ratio, min_tokens)


def test_kept_counts_match_the_budget_formula():
    prefix = torch.tensor([0, 3, 7, 100, 1000, 1200, 4097, 8192])
    for ratio, min_tokens in ((0.07, 1), (0.07, 4), (0.5, 1), (0.2, 300)):
        got = kept_counts(prefix, ratio, min_tokens).tolist()
        assert got == [min(n, _expected_budget(n, ratio, min_tokens)) for n in prefix.tolist()]


def test_topk_index_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, 30, generator=gen)  # 3 layers, 4 rows
    pad, recent = [0, 3, 7, 20], [25, 30, 28, 26]
    count = [5, 8, 3, 6]  # row 3: its whole prefix of 6 slots
    index = topk_index(scores, torch.tensor(pad), torch.tensor(recent), torch.tensor(count), k_slots=10)
    assert index.shape == (3, 4, 10)
    for layer in range(3):
        for row in range(4):
            got = index[layer, row, : count[row]].tolist()
            assert got == sorted(got)  # ascending
            assert set(got) == _brute_topk(scores[layer, row], pad[row], recent[row], count[row])
            assert index[layer, row, count[row] :].eq(0).all()
    assert set(index[0, 3, :6].tolist()) == set(range(20, 26))


def test_topk_index_keeps_a_recent_window():
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(2, 3, 40, generator=gen)
    pad, recent, count, window = [0, 4, 9], [35, 40, 30], [10, 12, 21], [5, 0, 11]  # row 2: its whole prefix
    index = topk_index(
        scores, torch.tensor(pad), torch.tensor(recent), torch.tensor(count), 24, torch.tensor(window)
    )
    for layer in range(2):
        for row in range(3):
            got = set(index[layer, row, : count[row]].tolist())
            share = window[row] / count[row]
            assert got == _brute_topk(scores[layer, row], pad[row], recent[row], count[row], share), (
                layer,
                row,
            )


def test_pool_scores_is_a_centred_running_max():
    gen = torch.Generator().manual_seed(3)
    scores = torch.rand(2, 3, 17, generator=gen)
    scores[0, 1, 4] = float("-inf")  # -inf (a slot outside the prefix) never wins over a real neighbour
    for pool in (1, 3, 5, 7):
        got = pool_scores(scores, pool)
        assert got.shape == scores.shape
        for idx in range(6):
            row = scores.view(6, 17)[idx]
            assert got.view(6, 17)[idx].tolist() == _brute_pool(row, 0, 17, pool)
    with pytest.raises(ValueError, match="pool must be odd"):
        pool_scores(scores, 4)


@pytest.mark.parametrize("pool", [3, 7])
def test_topk_index_pools_within_the_prefix(pool):
    """With ``pool``, a slot ranks by the best score among its prefix neighbours (never slots before ``pad`` or
    from ``recent_start`` on); the recent window is kept as without pooling."""
    gen = torch.Generator().manual_seed(11)
    scores = torch.rand(3, 4, 60, generator=gen)
    scores[:, :, 50:] = 10.0  # the slots past the prefix score highest: they must not lift their neighbours
    scores[:, 1, :6] = 10.0  # nor the pad slots of row 1
    pad, recent, count, window = [0, 6, 2, 30], [50, 50, 41, 50], [9, 12, 6, 20], [3, 0, 5, 20]
    index = topk_index(
        scores, torch.tensor(pad), torch.tensor(recent), torch.tensor(count), 24, torch.tensor(window), pool
    )
    for layer in range(3):
        for row in range(4):
            got = index[layer, row, : count[row]].tolist()
            assert got == sorted(got)
            assert index[layer, row, count[row] :].eq(0).all()
            share = window[row] / count[row]
            _check_pooled_topk(set(got), scores[layer, row], pad[row], recent[row], count[row], share, pool)


def test_topk_index_pooling_keeps_the_span_around_a_peak():
    scores = torch.tensor([[[0.0, 0.1, 0.0, 0.0, 0.9, 0.0, 0.0, 0.2, 0.3, 0.0]]])
    args = torch.tensor([0]), torch.tensor([10]), torch.tensor([3])
    assert topk_index(scores, *args, 3).tolist() == [[[4, 7, 8]]]  # the three best slots
    assert topk_index(scores, *args, 3, None, 3).tolist() == [[[3, 4, 5]]]  # the peak and its neighbours


@pytest.mark.parametrize("q_len", [1, 5])
def test_attention_logits_match_brute_force(q_len):
    gen = torch.Generator().manual_seed(2)
    query = torch.randn(2, 4, q_len, 8, generator=gen)
    key, value = torch.randn(2, 2, 9, 8, generator=gen), torch.randn(2, 2, 9, 8, generator=gen)
    mask = torch.ones(2, 1, q_len, 9, dtype=torch.bool)
    out, logits = _attention_with_logits(query, key, value, mask, 0.25)
    torch.testing.assert_close(logits.double(), _brute_logits(query, key, 0.25), atol=1e-5, rtol=1e-5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rows must be"):
        ScoreCollection("first_row")


def test_streaming_index_matches_brute_force():
    pad, recent, budgets, sinks = [0, 4, 2, 10], [30, 30, 12, 20], [10, 8, 12, 6], 4
    count = [min(b, r - p) for b, r, p in zip(budgets, recent, pad)]
    index = streaming_index(torch.tensor(pad), torch.tensor(recent), torch.tensor(count), sinks, k_slots=14)
    assert index.shape == (4, 14)
    for row in range(4):
        prefix = list(range(pad[row], recent[row]))
        want = set(prefix[:sinks]) | set(prefix[len(prefix) - (budgets[row] - sinks) :])
        assert set(index[row, : count[row]].tolist()) == want, row
    assert set(index[2, :10].tolist()) == set(range(2, 12))  # prefix of 10 <= budget 12: all of it


def _brute_pages(key: torch.Tensor, page_size: int):
    """Per page, elementwise min and max over the page's own slots: ``[B, H_kv, P, D]`` each."""
    length = key.shape[2]
    pages = [key[:, :, i : min(i + page_size, length)] for i in range(0, length, page_size)]
    return torch.stack([p.amin(2) for p in pages], 2), torch.stack([p.amax(2) for p in pages], 2)


@pytest.mark.parametrize(
    "length",
    [
        24,
        23,  # a partial last page
    ],
)
def test_page_summaries_match_brute_force(length):
    key = torch.randn(2, 2, length, 4, generator=torch.Generator().manual_seed(4)) + 3.0  # keys far from 0
    page_min, page_max = page_summaries(key, 4)
    want_min, want_max = _brute_pages(key, 4)
    assert torch.equal(page_min, want_min) and torch.equal(page_max, want_max)


@pytest.mark.parametrize("capacity", [40, 37])  # 37: a partial last page
def test_quest_window_refresh_equals_full_summaries(capacity):
    """After the prefill's full summary, each step recomputes only the pages its new tokens touch; the summaries
    then equal a full recomputation over the new keys (up to the new prefix end), also at the cache's end."""
    gen = torch.Generator().manual_seed(11)
    batch, kv_heads, dim, size = 2, 2, 4, 4
    key = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    quest = QuestSelection(
        [torch.device("cpu")], batch, size, pages_max=4, window_pages=math.ceil(5 / size) + 1
    )
    pad = torch.tensor([0, 3])
    recent = torch.tensor([10, 14])
    quest.recent.layer(0).copy_(recent)
    quest.refresh(0, key, pad)  # stale: every page
    quest.stale = False
    for step in range(6):  # each step rewrites up to 5 slots after the prefix end, then moves the end
        grow = torch.tensor([5, 3]) if step % 2 else torch.tensor([1, 5])
        new_end = (recent + grow).clamp(max=capacity)
        for b in range(batch):
            key[b, :, recent[b] : new_end[b]] = torch.randn(
                kv_heads, int(new_end[b] - recent[b]), dim, generator=gen
            )
        recent = new_end
        quest.recent.layer(0).copy_(recent)
        quest.refresh(0, key, pad)
        want_min, want_max = page_summaries(key, size)
        for b in range(batch):
            covered = math.ceil(int(recent[b]) / size)  # pages up to the prefix end are exact
            torch.testing.assert_close(quest.page_min[0][b, :, :covered], want_min[b, :, :covered])
            torch.testing.assert_close(quest.page_max[0][b, :, :covered], want_max[b, :, :covered])


def test_select_quest_matches_brute_force():
    gen = torch.Generator().manual_seed(5)
    batch, heads, kv_heads, dim, page, capacity = 3, 4, 2, 6, 4, 30
    key = torch.randn(batch, kv_heads, 24, dim, generator=gen)  # 6 pages
    query = torch.randn(batch, heads, 1, dim, generator=gen)
    pad, recent, pages = [0, 5, 9], [24, 22, 17], [2, 3, 5]  # row 2: 5 pages asked, 3 overlap its prefix
    page_min, page_max = page_summaries(key, page)
    selected = select_quest(
        query,
        page_min,
        page_max,
        torch.tensor(pad),
        torch.tensor(recent),
        torch.tensor(pages),
        max(pages),
        page,
        capacity,
    )
    assert selected.shape == (batch, capacity)
    want_min, want_max = _brute_pages(key, page)
    for b in range(batch):
        scores = {}
        for p in range(6):
            if p * page + page <= pad[b] or p * page >= recent[b]:
                continue  # page wholly outside the prefix
            total = 0.0
            for h in range(heads):
                q = query[b, h, 0].double()
                kv = h // (heads // kv_heads)
                total += torch.maximum(q * want_min[b, kv, p].double(), q * want_max[b, kv, p].double()).sum()
            scores[p] = float(total)
        best = sorted(scores, key=scores.get, reverse=True)[: pages[b]]
        want = {s for p in best for s in range(p * page, p * page + page) if pad[b] <= s < recent[b]}
        assert _slots(selected[b]) == want, b


# ----------------------------------------------------------------------------- scores from the verify pass
def _spy_attention(monkeypatch) -> dict:
    """Wrap the attention backend: after every prefill/verify call that collected scores, compare them with
    brute-force head-mean softmax weights of the rows the collection names; note which draft calls were sparse."""
    seen = dict(prefill={}, verify=0, sparse_drafts=0, dense_drafts=0)
    real_get = interface.get_backend

    def get(name):
        backend = real_get(name)

        def wrapped(module, query, key, value, view, *, scaling, sliding_window=None, mods=PLAIN):
            out = backend(
                module, query, key, value, view, scaling=scaling, sliding_window=sliding_window, mods=mods
            )
            step, layer = view.step, module.layer_idx
            collection = step.score_collection()
            keys = key[:, :, : step.kv_len]
            pad, start = view.pad.tolist(), view.start.tolist()
            if step.phase is Phase.PREFILL and collection is not None:
                rows = list(range(step.q_len - PREFILL_SEED_ROWS, step.q_len))
                want = _brute_scores(query, keys, pad, start, scaling, rows, weights=True)
                torch.testing.assert_close(collection.layer(layer).double(), want, atol=1e-4, rtol=1e-4)
                seen["prefill"][layer] = want
            elif step.phase is Phase.VERIFY and collection is not None:
                got = collection.layer(layer)[..., : step.kv_len].double()
                if collection.rows == "per_row":
                    want = torch.stack(
                        [
                            _brute_scores(query, keys, pad, start, scaling, [i], True)
                            for i in range(step.q_len)
                        ],
                        1,
                    )
                else:
                    rows = [0, step.q_len - 1] if collection.rows == "two_rows" else list(range(step.q_len))
                    want = _brute_scores(query, keys, pad, start, scaling, rows, weights=True)
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
                seen["verify"] += 1
            elif step.phase is Phase.DRAFT:
                seen["sparse_drafts" if step.kv_selection is not None else "dense_drafts"] += 1
            return out

        return wrapped

    monkeypatch.setattr(interface, "get_backend", get)
    return seen


@pytest.mark.parametrize("pool", [1, 7])
@pytest.mark.parametrize("selection", ["two_rows", "all", "last_token"])
def test_verify_pass_fills_scores_and_prefill_seeds_selection(monkeypatch, selection, pool):
    """In a real generate call: the prefill's last rows seed the first selection, every verify pass fills every
    layer's scores (softmax weights, checked against brute force from the attention's own q and k), each
    selection is the top-k of those scores, and every draft step attends through a selection."""
    model = _model("llama")
    layers = model.config.num_hidden_layers
    ids, mask = ragged_batch(3, PROMPT_LEN)
    calls = _spy_selections(monkeypatch)
    seen = _spy_attention(monkeypatch)
    out = _speculate(
        model,
        ids,
        mask,
        3,
        max_new=12,
        strategy="vegas",
        selection=selection,
        vegas_recent_share=0.5,
        vegas_pool=pool,
        **SPARSE,
    )
    stats = out.speculation
    assert torch.equal(out.sequences, _plain("llama", 3)[:, : PROMPT_LEN + 12])

    # the prefill's last rows seeded the first selection: top-k of the brute-force seed scores
    seed = calls[0]
    assert seed["seed"] and sorted(seen["prefill"]) == list(range(layers))
    assert seed["prefix_end"] == [PROMPT_LEN] * 3
    for layer in range(layers):
        for row in range(3):
            args = seen["prefill"][layer][row], seed["pad"][row], PROMPT_LEN, seed["budgets"][row], 0.5
            _assert_topk(seed["selected"][layer][row], *args, pool)

    # every verify pass that checked drafts filled every layer's scores; each selection is the top-k of them (a
    # plain step, here the call's last one with one token left, neither collects nor selects)
    verify_calls = calls[1:]
    drafted = sum(k > 0 for k in stats.draft_tokens)
    assert drafted >= stats.steps - 1
    assert len(verify_calls) == drafted and seen["verify"] == drafted * layers
    for call in verify_calls:
        for layer in range(layers):
            scores = call["scores"][layer]  # [B, capacity] (the accepted row's, for last_token)
            for row in range(3):
                args = scores[row], call["pad"][row], call["prefix_end"][row], call["budgets"][row], 0.5
                _assert_topk(call["selected"][layer][row], *args, pool)
    assert seen["sparse_drafts"] == sum(stats.draft_tokens) * layers and seen["dense_drafts"] == 0


# ------------------------------------------------------------------------------------------ sampling, end to end
def _accept_every_draft(drafts, num_drafts, draft_probs, scores, generator=None):
    """A lossy verifier: keeps every proposed draft, bonus from the target at the position after them."""
    accepted = num_drafts.clone()
    p = torch.softmax(scores[torch.arange(drafts.shape[0]), accepted], dim=-1)
    bonus = torch.multinomial(p, 1, generator=generator).squeeze(1)
    tokens = torch.cat([drafts, bonus[:, None]], dim=1).scatter(1, accepted[:, None], bonus[:, None])
    return accepted, tokens


def _sample_sparse(model, prompt: list[int], **settings):
    ids = torch.tensor([prompt]).repeat(E2E_ROWS, 1)
    torch.manual_seed(0)
    return _speculate(
        model,
        ids,
        torch.ones_like(ids),  # token 0 is also the pad id: say that nothing is padding
        2,
        max_new=4,  # prefill token + a step with K = min(2, remaining - 1) = 2
        do_sample=True,
        strategy="vegas",
        ratio=0.1,
        min_tokens=2,
        **settings,
    )


@pytest.mark.parametrize("draft_weights", [None, "int4"])
def test_vegas_sampling_matches_target_distribution(monkeypatch, draft_weights):
    """4000 identical 24-token prompts, one sampled generate call: the first token from the prefill, the next
    three from one step with K = 2 sparse drafts (budget 3 of 24 tokens; with ``draft_weights`` drafted by the
    target's int4 copy, its q / k / v and gate / up stacked). Token pairs must follow the target's exact joint
    distribution, while drafts are both accepted and rejected; the same test rejects the output of a verifier that
    keeps every sparse draft."""
    model = e2e_model()
    prompt = torch.randint(0, E2E_VOCAB, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    target_12, target_23 = _joint_next_tokens(model, prompt)

    settings = {} if draft_weights is None else dict(draft_weights=draft_weights)
    calls = _spy_selections(monkeypatch)
    out = _sample_sparse(model, prompt, **settings)
    _assert_sparse(calls, "vegas")
    stats = out.speculation
    assert stats.draft_weights == draft_weights  # with int4, the drafts came from the copy
    assert stats.draft_tokens[0] == 2
    first_step = torch.tensor(stats.accepted_tokens[0])
    assert torch.bincount(first_step, minlength=3).min() > 200, first_step  # 0, 1 and 2 accepted all occur
    new = out.sequences[:, len(prompt) :]
    assert new.shape == (E2E_ROWS, 4)
    assert _joint_pvalue(new[:, 0], new[:, 1], target_12) > 1e-3
    assert _joint_pvalue(new[:, 1], new[:, 2], target_23) > 1e-3

    monkeypatch.setattr(loop, "verify_speculative_sampling", _accept_every_draft)
    lossy = _sample_sparse(model, prompt, **settings).sequences[:, len(prompt) :]
    assert _joint_pvalue(lossy[:, 1], lossy[:, 2], target_23) < 1e-6


# ----------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "speculation, message",
    [
        (dict(ratio=0.0), r"ratio must be a number in \(0, 1\]"),
        (dict(ratio=-0.1), r"ratio must be a number in \(0, 1\]"),
        (dict(ratio=1.5), r"ratio must be a number in \(0, 1\]"),
        (dict(ratio=True), r"ratio must be a number"),
        (dict(min_tokens=0), r"min_tokens must be >= 1"),
        (dict(min_tokens=-3), r"min_tokens must be >= 1"),
        (dict(min_tokens=2.5), r"min_tokens must be an int"),
        (dict(selection="first_row"), r"unknown selection 'first_row'"),
    ],
)
@pytest.mark.parametrize("strategy", ["vegas", "streaming", "quest"])
def test_bad_config_names_the_field(strategy, speculation, message):
    ids, mask = ragged_batch(2)
    with pytest.raises(ValueError, match=message):
        _speculate(_model("llama"), ids, mask, 2, max_new=4, strategy=strategy, **speculation)
    with pytest.raises(ValueError, match=message):
        SpeculationConfig(strategy=strategy, **speculation)


@pytest.mark.parametrize("strategy", ["vegas", "streaming", "quest"])
def test_self_speculation_rejects_a_draft_model(strategy):
    model = _model("llama")
    ids, mask = ragged_batch(2)
    with pytest.raises(ValueError, match="draft_model"):
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=4,
            do_sample=False,
            custom_generate=hsv.generate,
            speculation=dict(strategy=strategy),
            draft_model=make_model("llama", seed=1),
        )
    with pytest.raises(ValueError, match="draft_model"):
        resolve(DRAFTERS, strategy).from_config(
            SpeculationConfig(strategy=strategy), target=model, draft_model=model
        )
    with pytest.raises(ValueError, match="selection must be one of"):
        SelfSpecDrafter(selection="first_row")


@pytest.mark.parametrize("name", ["vegas", "draft_model"])
def test_chunked_prefill_equals_plain_generate(monkeypatch, name):
    """Prompts prefilled in chunks (here 16 tokens per forward: several chunks of a ragged batch, the first one
    short) give the plain greedy output; Vegas' first selection comes from the last chunk's rows."""
    from hf_sparse_verify.generation.engine import runner

    monkeypatch.setattr(runner.ModelRunner.prefill, "__defaults__", (48,))  # 16 tokens per row and forward
    forwards = []
    original = runner.ModelRunner.forward

    def count(self, ids, start, phase, **kwargs):
        if phase == "prefill":
            forwards.append(ids.shape[1])
        return original(self, ids, start, phase, **kwargs)

    monkeypatch.setattr(runner.ModelRunner, "forward", count)
    model = _model("llama")
    ids, mask = ragged_batch(3, PROMPT_LEN)
    calls = _spy_selections(monkeypatch)
    if name == "vegas":
        out = _speculate(model, ids, mask, 3, strategy="vegas", **SPARSE)
        _assert_sparse(calls, "vegas")
    else:
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False,
            custom_generate=hsv.generate, speculation=dict(strategy="draft_model", num_draft_tokens=3),
            draft_model=make_model("llama", seed=1), return_dict_in_generate=True,
        )  # fmt: skip
    assert torch.equal(out.sequences, _plain("llama", 3))
    assert forwards[:3] == [8, 16, 16]  # the target's prompt of 40 tokens: three chunks, the first short


def test_score_buffers_of_a_device_form_one_block():
    """Fixed score buffers of consecutive layers on one device are views of one block, so the selection update reads
    all layers without stacking; a layer on another device starts a new block; the block is refused until every
    layer has written."""
    collection = ScoreCollection("two_rows", weights=True)
    cpu, meta = torch.device("cpu"), torch.device("meta")
    collection.fix_buffers({0: ((2, 5), cpu), 1: ((2, 5), cpu), 2: ((2, 5), meta), 3: ((2, 5), meta)})
    assert set(collection.blocks) == {(0, 1), (2, 3)}
    with pytest.raises(RuntimeError, match="no attention scores for layer 0"):
        collection.block([0, 1])
    collection.write(0, torch.ones(2, 3))
    collection.write(1, torch.full((2, 5), 2.0))
    block = collection.block([0, 1])
    assert block.shape == (2, 2, 5)
    assert block[0, :, :3].eq(1).all() and block[1].eq(2).all()  # writes landed in the block
    assert collection.block([0]) is None  # not allocated as its own block
