"""The engine on the ``"triton"`` attention backend (the CUDA default; here Triton's CPU interpreter): greedy
output still equals plain ``generate`` token for token in float32, for every strategy, and the backend's Vegas
scores equal the reference backend's. CUDA-graph capture itself needs a GPU (tests at the end)."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from conftest import char_tokenizer, make_model, noisy_copy, ragged_batch  # noqa: F401

import hf_sparse_verify as hsv
from hf_sparse_verify.attention import triton_backend

MAX_NEW = 13


@functools.cache
def _pair(arch: str):
    model = make_model(arch)
    return model, noisy_copy(model)


def _run(model, ids, mask, draft=None, max_new=MAX_NEW, **speculation):
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new,
        custom_generate=hsv.generate,
        speculation=dict(attention_backend="triton", **speculation),
        draft_model=draft,
        return_dict_in_generate=True,
    )


@pytest.fixture
def kernel_calls(monkeypatch):
    """Record kernel calls, so a test fails if the backend silently fell back to the reference."""
    calls = []
    decode, sparse = triton_backend.decode_attention, triton_backend.token_sparse_kernel

    def spy_decode(*args, **kwargs):
        calls.append(kwargs.get("collect"))
        return decode(*args, **kwargs)

    def spy_sparse(*args, **kwargs):
        calls.append("token_sparse")
        return sparse(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "decode_attention", spy_decode)
    monkeypatch.setattr(triton_backend, "token_sparse_kernel", spy_sparse)
    return calls


@pytest.mark.parametrize(
    "arch, batch, strategy, k",
    [
        ("llama", 3, "prompt_lookup", 3),
        ("qwen3", 1, "draft_model", 4),
        ("mistral", 3, "draft_model", 2),  # sliding window 9, shorter than the sequences
        ("qwen3_moe", 3, "prompt_lookup", 5),
    ],
)
def test_greedy_equals_plain_generate(kernel_calls, arch, batch, strategy, k):
    model, draft = _pair(arch)
    ids, mask = ragged_batch(batch)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    out = _run(
        model, ids, mask, draft if strategy == "draft_model" else None, strategy=strategy, num_draft_tokens=k
    )
    assert torch.equal(out.sequences, expected)
    assert len(kernel_calls) > 0


@pytest.mark.parametrize("strategy", ["vegas", "streaming"])
def test_self_speculation_equals_plain_generate(kernel_calls, strategy):
    model = make_model("llama")
    ids, mask = ragged_batch(3)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    out = _run(model, ids, mask, strategy=strategy, num_draft_tokens=3, min_tokens=4, ratio=0.3)
    assert torch.equal(out.sequences, expected)
    assert "token_sparse" in kernel_calls  # draft steps read only their selection
    if strategy == "vegas":
        assert "two_rows" in kernel_calls  # the verify pass collected its scores in the kernel


@pytest.mark.parametrize("lse", ["step", "carried"])
def test_fused_scores_equal_reference_scores(monkeypatch, lse):
    """Vegas selections made from the kernel's fused scores equal those from the reference backend's (weights
    normalised by each row's own log-sum-exp, or by the carried one)."""
    from hf_sparse_verify.generation.drafters.self_spec import drafter as self_spec

    picks = {"triton": [], "reference": []}
    original = self_spec.topk_index

    def spy(scores, pad, recent, count, k_slots, window=None, pool=1):
        selected = original(scores, pad, recent, count, k_slots, window, pool)
        spy.sink.append((selected.clone(), count.clone()))
        return selected

    monkeypatch.setattr(self_spec, "topk_index", spy)
    model = make_model("llama")
    ids, mask = ragged_batch(3)
    for backend in ("triton", "reference"):
        spy.sink = picks[backend]
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=MAX_NEW,
            custom_generate=hsv.generate,
            speculation=dict(
                strategy="vegas",
                num_draft_tokens=3,
                min_tokens=4,
                ratio=0.3,
                attention_backend=backend,
                vegas_lse=lse,
            ),
        )
    assert len(picks["triton"]) == len(picks["reference"]) > 2
    for (a, count_a), (b, count_b) in zip(picks["triton"], picks["reference"]):
        assert torch.equal(count_a, count_b)
        assert torch.equal(a, b)


def test_cuda_graphs_switch_is_validated():
    with pytest.raises(ValueError, match="cuda_graphs must be None"):
        hsv.SpeculationConfig(cuda_graphs="yes")


def test_graphs_on_cpu_silent_by_default_warn_once_when_asked(monkeypatch):
    from hf_sparse_verify import _logging

    monkeypatch.setattr(_logging, "_warned", set())
    model = make_model("llama")
    ids, mask = ragged_batch(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default (None) means "where possible": no warning on CPU
        out = _run(model, ids, mask, strategy="prompt_lookup", num_draft_tokens=2)
    assert out.speculation.graph_capture_s == 0.0
    with pytest.warns(RuntimeWarning, match="cuda_graphs=True, but CUDA graphs need a CUDA model") as record:
        for _ in range(2):
            _run(model, ids, mask, strategy="prompt_lookup", num_draft_tokens=2, cuda_graphs=True)
    assert sum("cuda_graphs=True" in str(w.message) for w in record) == 1


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize(
    "arch, strategy, k_policy",
    [
        ("llama", "prompt_lookup", "utility"),
        ("llama", "draft_model", "constant"),
        ("qwen3_moe", "prompt_lookup", "heuristic"),
        ("mistral", "draft_model", "utility"),
    ],
)
@pytest.mark.parametrize("batch", [1, 3])
def test_cuda_graph_path_equals_plain_generate(arch, strategy, k_policy, batch):
    """On the GPU in float32: the captured path (K changing between steps under the adaptive policies) gives the
    plain greedy output token for token."""
    model, draft = (m.cuda() for m in _pair(arch))
    ids, mask = (t.cuda() for t in ragged_batch(batch))
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
    out = _run(
        model,
        ids,
        mask,
        draft if strategy == "draft_model" else None,
        max_new=40,
        strategy=strategy,
        k_policy=k_policy,
        num_draft_tokens=3,
        max_draft_tokens=8,
    )
    assert torch.equal(out.sequences, expected)
    assert out.speculation.graph_capture_s > 0
    if k_policy == "utility":
        assert len(set(out.speculation.draft_tokens)) > 1  # K changed between replays


@needs_cuda
@pytest.mark.parametrize(
    "strategy, extra", [("vegas", {}), ("vegas", {"vegas_lse": "carried"}), ("streaming", {})]
)
def test_self_speculation_on_gpu_equals_plain_generate(strategy, extra):
    model = make_model("llama").cuda()
    ids, mask = (t.cuda() for t in ragged_batch(3))
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
    out = _run(
        model, ids, mask, max_new=40, strategy=strategy, num_draft_tokens=3, min_tokens=4, ratio=0.3, **extra
    )
    assert torch.equal(out.sequences, expected)


def test_capture_failure_falls_back_with_one_warning(monkeypatch):
    """Where capture fails (here: no CUDA) the loop warns once and decodes eagerly, with the self-speculative
    drafter's selections already moved into the fixed index buffers a captured draft step would read; the
    output is still the plain greedy output."""
    from hf_sparse_verify import _logging
    from hf_sparse_verify.generation.engine.runner import ModelRunner

    monkeypatch.setattr(ModelRunner, "can_capture", lambda self: True)
    monkeypatch.setattr(_logging, "_warned", set())
    model = make_model("llama")
    ids, mask = ragged_batch(3)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    with pytest.warns(RuntimeWarning, match="CUDA-graph capture of LlamaForCausalLM failed") as record:
        out = _run(model, ids, mask, max_new=8, strategy="vegas", num_draft_tokens=3, min_tokens=4, ratio=0.3)
        _run(model, ids, mask, max_new=2, strategy="prompt_lookup", num_draft_tokens=1)
    assert sum("CUDA-graph capture" in str(w.message) for w in record) == 1
    assert torch.equal(out.sequences, expected)
