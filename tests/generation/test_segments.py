"""Steps of a model over several GPUs run one graph per device segment (`engine.segments`). On CPU the graphs are
stand-ins that rerun the captured segment on its static buffers (`_EagerGraph`), which tests the hand-over itself:
what each segment's first layer copies into its static buffers, the segment's own step context, and the layers that
pass the hidden state on. The same on two GPUs, with CUDA graphs, is in tests/test_placement.py."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from hf_sparse_verify._compat import decoder_layers
from hf_sparse_verify.generation.engine.runner import ModelRunner
from hf_sparse_verify.generation.engine.segments import SegmentGraphs
from hf_sparse_verify.integrations import Mode, SegmentLayer, plan_swaps, speculation_mode
from hf_sparse_verify.placement import Segment, device_segments, graph_obstacle, spans_gpus
from hf_sparse_verify.step import Phase

CPU = torch.device("cpu")


def _wrapped(model):
    """Wrap every decoder layer in a `SegmentLayer` (what `Mode(device_segments=True)` does on a multi-GPU model);
    returns a function that puts the originals back."""
    layers = decoder_layers(model)
    originals = list(layers)
    for i, layer in enumerate(originals):
        layers[i] = SegmentLayer(layer, i)

    def restore():
        for i, layer in enumerate(originals):
            layers[i] = layer

    return restore


def _runner(model, pads):
    runner = ModelRunner(model, len(pads), 64, CPU, "reference")
    runner.set_padding(pads)
    return runner


@pytest.mark.parametrize("split", [[range(0, 1), range(1, 4)], [range(0, 2), range(2, 3), range(3, 4)]])
def test_segment_replays_equal_eager_steps(split):
    """Two runners on one model: eager steps on one, segment replays on the other; the logits of prefill and of
    verify steps of widths 3 and 1 at advancing, ragged positions agree."""
    model = make_model("llama", num_hidden_layers=4)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 90, (2, 12), generator=gen)
    pads = [0, 4]
    restore = _wrapped(model)
    try:
        with speculation_mode(model, mode=Mode()):
            eager, graphed = _runner(model, pads), _runner(model, pads)
            for runner in (eager, graphed):
                runner.prefill(prompt)
            graphed.graphs = SegmentGraphs(graphed, [Segment(CPU, r) for r in split], cuda=False)
            graphed.graphs.add([1, 3], Phase.VERIFY, {})
            assert graphed.graphs.captures == 2
            start = torch.tensor([12, 12])
            for width in (3, 1, 3, 3, 1):
                ids = torch.randint(3, 90, (2, width), generator=gen)
                a = eager.forward(ids, start, Phase.VERIFY, kv_len=int(start.max()) + width)
                b = graphed.forward(ids, start, Phase.VERIFY, kv_len=int(start.max()) + width)
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
                start = start + torch.tensor([width, width - 1 if width > 1 else 1])  # rows advance unevenly
            # the caches agree too: every segment wrote its layers' keys at the right slots
            for la, lb in zip(eager.cache.layers, graphed.cache.layers):
                torch.testing.assert_close(la.keys[:, :, :20], lb.keys[:, :, :20], rtol=1e-5, atol=1e-5)
    finally:
        restore()


def test_capture_without_segment_layers_says_how_to_switch():
    model = make_model("llama", num_hidden_layers=2)
    with speculation_mode(model, mode=Mode()):
        runner = _runner(model, [0])
        runner.prefill(torch.randint(3, 90, (1, 6)))
        graphs = SegmentGraphs(runner, [Segment(CPU, range(0, 1)), Segment(CPU, range(1, 2))], cuda=False)
        with pytest.raises(RuntimeError, match="device_segments=True"):
            graphs.add([1], Phase.VERIFY, {})
        assert graphs.find(Phase.VERIFY, 1, {}) is None  # nothing half-captured is kept


def test_layers_with_their_own_inputs_cannot_share_a_segment_graph():
    """A layer given other inputs than its segment's first layer (per-layer masks, say) fails the capture."""
    model = make_model("llama", num_hidden_layers=2)
    restore = _wrapped(model)
    try:
        with speculation_mode(model, mode=Mode()):
            runner = _runner(model, [0])
            runner.prefill(torch.randint(3, 90, (1, 6)))
            graphs = SegmentGraphs(runner, [Segment(CPU, range(0, 2))], cuda=False)
            layer = decoder_layers(model)[1]
            own = layer.forward

            def forward(hidden, *args, **kwargs):  # layer 1 gets a position table of its own
                pe = kwargs.get("position_embeddings")
                if pe is not None:
                    kwargs["position_embeddings"] = tuple(t.clone() for t in pe)
                return own(hidden, *args, **kwargs)

            layer.forward = forward
            with pytest.raises(RuntimeError, match="other inputs than the first layer"):
                graphs.add([1], Phase.VERIFY, {})
    finally:
        restore()


def test_device_segments_group_consecutive_layers():
    model = make_model("llama", num_hidden_layers=4)
    assert device_segments(model) == [Segment(CPU, range(0, 4))]
    assert not spans_gpus(model)
    layers = decoder_layers(model)
    layers[2].to("meta")
    assert device_segments(model) == [
        Segment(CPU, range(0, 2)), Segment(torch.device("meta"), range(2, 3)), Segment(CPU, range(3, 4))
    ]  # fmt: skip
    assert not spans_gpus(model)  # meta (offloaded) is not a GPU
    assert "beside the GPU" not in (graph_obstacle(model) or "")  # no GPU here at all


def test_segment_layers_only_on_models_over_several_gpus():
    """`Mode(device_segments=True)` leaves a one-device model's layers alone."""
    model = make_model("llama", num_hidden_layers=2)
    swaps = plan_swaps(model, Mode(device_segments=True))
    assert not any(isinstance(new, SegmentLayer) for *_, new in swaps)


def test_mode_device_segments_wraps_each_layer_once(monkeypatch):
    """On a model over several GPUs (faked here: the placement checks say so) every decoder layer is wrapped once,
    its original inside, and the walk goes on into the original's modules; everything is put back on exit."""
    from hf_sparse_verify.integrations import switch

    model = make_model("llama", num_hidden_layers=3)
    originals = list(decoder_layers(model))
    monkeypatch.setattr(switch, "spans_gpus", lambda m: True)
    monkeypatch.setattr(switch, "device_segments", lambda m: [Segment(CPU, range(0, 3))])
    with speculation_mode(model, mode=Mode(device_segments=True, fused=True, fused_parts=frozenset({"mlp"}))):
        layers = decoder_layers(model)
        assert [type(x).__name__ for x in layers] == ["SegmentLayer"] * 3
        assert [x.layer for x in layers] == originals and [x.index for x in layers] == [0, 1, 2]
    assert list(decoder_layers(model)) == originals


def test_rotary_table_follows_the_input_embedding_for_segmented_calls():
    """A segmented model's rotary table on another device than its input embedding is replaced, for the call, by a
    copy on the embedding's device without accelerate's hook; on the same device, or unsegmented, it stays."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    from hf_sparse_verify.integrations.switch import Mode, _rotary_table, _Walk

    model = make_model("llama", num_hidden_layers=2)
    table = model.model.rotary_emb
    add_hook_to_module(table, AlignDevicesHook(execution_device="cpu"))
    walk = _Walk(Mode(device_segments=True), None, {}, segmented=True, first_device=torch.device("meta"))
    moved = _rotary_table(table, walk)
    assert moved is not None and moved is not table and not hasattr(moved, "_hf_hook")
    assert moved.inv_freq.device.type == "meta" and table.inv_freq.device.type == "cpu"
    assert hasattr(table, "_hf_hook")  # the original keeps its hook
    assert _rotary_table(table, _Walk(Mode(), None, {}, segmented=True, first_device=CPU)) is None
    assert (
        _rotary_table(table, _Walk(Mode(), None, {}, segmented=False, first_device=torch.device("meta")))
        is None
    )


def test_forward_skips_accelerates_input_move_only_to_another_device():
    """accelerate's top-level hook moves a dispatched model's inputs to its map's main device (the lowest GPU), which
    need not hold the input embedding: a segmented step calls the forward without that hook where the devices differ
    (a copy to another GPU cannot sit inside the step's first captured piece), and the model itself otherwise."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    from hf_sparse_verify._compat import forward_on

    model = make_model("llama", num_hidden_layers=2)
    assert forward_on(model, CPU) is model  # no hook
    add_hook_to_module(model, AlignDevicesHook(execution_device="cpu", io_same_device=True))
    assert forward_on(model, CPU) is model
    bare = forward_on(model, torch.device("meta"))
    assert bare is not model and bare == model._old_forward
    ids = torch.randint(3, 90, (1, 6))
    torch.testing.assert_close(bare(input_ids=ids).logits, model(input_ids=ids).logits)
