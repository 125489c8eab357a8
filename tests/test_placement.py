"""Models spread over devices: tensor parallelism through transformers' ``tp_plan="auto"`` (run for real on CPU, two
processes under ``torchrun`` with gloo), the placement checks that turn CUDA graphs and fused modules off, and
(with two GPUs) Triton launches on the device of their tensors and whole calls under an accelerate device map."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_model

import hf_sparse_verify as hsv
from hf_sparse_verify.integrations import Mode, speculation_mode
from hf_sparse_verify.kernels._triton import on_input_device
from hf_sparse_verify.placement import cuda_devices, graph_obstacle, swappable, tensor_parallel

ROOT = Path(__file__).resolve().parents[1]
TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
STRATEGIES = ["prompt_lookup", "draft_model", "vegas", "streaming", "quest", "utility"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun() -> list[str] | None:
    exe = Path(sys.executable).with_name("torchrun")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("torchrun")
    return [found] if found else None


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without torch.distributed")
@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3-moe"])
@pytest.mark.parametrize("ranks", ["cpu", "gpu"])
def test_tensor_parallel_greedy_equals_plain(tmp_path, shape, ranks):
    """Two ranks (CPU with gloo; or two GPUs with NCCL, our steps then CUDA graphs with the collectives inside)
    load one random checkpoint sharded by ``tp_plan="auto"``; prompt lookup, the target drafting for itself, vegas,
    streaming, quest and the utility policy give plain ``generate``'s tokens at batch 1 and a ragged batch of 3."""
    torchrun = _torchrun()
    if torchrun is None:
        pytest.skip("torchrun not found next to the interpreter or on PATH")
    if ranks == "gpu" and not TWO_GPUS:
        pytest.skip("needs two CUDA GPUs")
    out = tmp_path / "tp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if ranks == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.pop("TRITON_INTERPRET", None)  # CPU ranks take the reference backend, as a CPU user's would
    command = [
        *torchrun, "--nproc-per-node", "2", "--master-port", str(_free_port()),
        str(ROOT / "benchmarks" / "check_tensor_parallel.py"), "--shape", shape, "--new-tokens", "16",
        "--checkpoint", str(tmp_path / "model"), "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    report = json.loads(out.read_text())["records"][-1]  # the results file: this run is its last record
    assert report["ranks"] == 2
    assert report["agreed_seconds"] == 2.0  # rank 0 offered 1.0, rank 1 offered 2.0: both use the largest
    assert report["agreed_in_background"] == 2.0
    # our calls run the local shards with explicit collectives: 2 layers' attention and MLP (or MoE block) reduced,
    # the head gathered (transformers 5.24 also shards the embedding over the vocabulary, 5.17 does not)
    shards = report["local_shards"]
    assert shards.startswith("local shards: 1 GatherLinear") and "4 ReduceOutput" in shards, shards
    if shape == "tiny-qwen3-moe":  # each rank holds every expert's share of the intermediate channels
        assert "2 Qwen3MoeExperts" in shards, shards
    cases = report["equality"]
    assert len(cases) == 12 and {c["batch"] for c in cases} == {1, 3}
    assert all(c["identical_to_plain"] for c in cases), cases
    # drafts were accepted (fewer steps than tokens), so verification ran on the sharded model, not just decoding
    assert all(c["mean_acceptance_length"] > 1.0 for c in cases if c["strategy"] in ("draft_model", "vegas"))


def test_single_device_model_has_no_obstacle():
    model = make_model("llama")
    assert not tensor_parallel(model)
    assert cuda_devices(model) == [] or len(cuda_devices(model)) == 1
    assert graph_obstacle(model) is None


def test_hooked_and_offloaded_modules_are_not_replaced():
    """accelerate's hook on a module (it moves inputs between devices, streams offloaded weights in) would be lost
    with a replacement: hooked modules and modules with meta (offloaded) weights keep their class."""
    model = make_model("llama")
    model.model.norm._hf_hook = object()  # what accelerate.hooks.add_hook_to_module leaves on a module
    offloaded = model.model.layers[1].input_layernorm
    offloaded.weight = torch.nn.Parameter(torch.empty(offloaded.weight.shape, device="meta"))
    with speculation_mode(model, mode=Mode(attention=False, fused=True)):
        assert type(model.model.norm).__name__ == "LlamaRMSNorm"
        assert type(model.model.layers[1].input_layernorm).__name__ == "LlamaRMSNorm"
        assert type(model.model.layers[0].input_layernorm).__name__ == "TritonRMSNorm"


def test_hooks_that_only_move_inputs_inside_a_layer_allow_replacements():
    """What ``dispatch_model`` leaves on a block and its submodules: a hook on the layer that moves its inputs, and
    hooks on every submodule with weights that move inputs to where the weights already are. Inside the layer the
    latter do nothing, so the MLPs are replaced (lossy sparse FFN here: it needs no GPU); an offloading hook, a hook
    executing on another device, or one outside a decoder layer keeps the module as it is."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module, attach_execution_device_hook

    model = make_model("llama", num_hidden_layers=4)
    for layer in model.model.layers:
        add_hook_to_module(layer, AlignDevicesHook("cpu"))
        attach_execution_device_hook(layer, "cpu")
    add_hook_to_module(model.model.norm, AlignDevicesHook("cpu"))
    assert hasattr(model.model.layers[0].mlp.gate_proj, "_hf_hook")  # hooked down to the linears
    moved = model.model.layers[1].mlp.down_proj
    moved._hf_hook.execution_device = "meta"  # executes elsewhere than its weight
    model.model.layers[2].mlp.up_proj._hf_hook.offload = True
    with speculation_mode(model, mode=Mode(attention=False, sparse_ffn=True)):
        kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
        assert kinds == ["GatedMLP", "LlamaMLP", "LlamaMLP", "GatedMLP"]
    assert [type(layer.mlp).__name__ for layer in model.model.layers] == ["LlamaMLP"] * 4
    assert not swappable(
        model.model.norm, in_layer=False
    )  # outside a layer: its inputs may come from elsewhere
    assert swappable(model.model.layers[0].mlp, in_layer=True) and not swappable(model.model.layers[0].mlp)


def test_on_input_device_passes_through_off_cuda():
    calls = []

    @on_input_device
    def launch(x, y, scale=1.0):
        calls.append(torch.cuda.is_initialized() if torch.cuda.is_available() else None)
        return x * scale + y

    x = torch.ones(3)
    assert torch.equal(launch(x, x, scale=2.0), torch.full((3,), 3.0))
    assert torch.equal(launch(x=x, y=x), torch.full((3,), 2.0))  # keyword-only tensors too
    assert launch.__name__ == "launch" and len(calls) == 2


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_kernel_runs_on_its_tensors_device():
    """GPU 0 current, tensors on GPU 1: the decode-attention kernel runs there and matches its reference."""
    from hf_sparse_verify.kernels.decode_attention.naive import decode_attention_naive
    from hf_sparse_verify.kernels.decode_attention.op import decode_attention

    torch.cuda.set_device(0)
    dev = torch.device("cuda:1")
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(2, 8, 3, 64, device=dev, generator=gen)
    k = torch.randn(2, 2, 256, 64, device=dev, generator=gen)
    v = torch.randn(2, 2, 256, 64, device=dev, generator=gen)
    start = torch.tensor([200, 120], device=dev)
    pad = torch.tensor([0, 40], device=dev)
    out, _ = decode_attention(q, k, v, start, pad, scale=0.125)
    ref, _ = decode_attention_naive(q, k, v, start, pad, 0.125, 0, None)
    torch.cuda.synchronize(dev)
    assert torch.cuda.current_device() == 0
    torch.testing.assert_close(out, ref.to(out.dtype), atol=2e-4, rtol=2e-4)


def _split_equals_plain(device_map: dict, strategy: str, obstacle: str | None) -> None:
    """A float32 tiny Llama dispatched by ``device_map``, default settings: plain ``generate``'s tokens, batch 2
    ragged. Over several GPUs the steps run one CUDA graph per device segment, captured by the first call only;
    with offloaded layers (``obstacle``) they run eagerly."""
    from accelerate import dispatch_model

    model = dispatch_model(make_model("llama", num_hidden_layers=3), device_map=device_map)
    if obstacle is None:
        assert graph_obstacle(model) is None
    else:
        assert obstacle in graph_obstacle(model)
    ids = torch.randint(3, 90, (2, 40), generator=torch.Generator().manual_seed(0))
    ids[:, -12:] = ids[:, -24:-12]
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    ids, mask = ids.to("cuda:0"), mask.to("cuda:0")
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    settings = {"strategy": strategy, "num_draft_tokens": 4}
    if strategy == "utility":
        settings = {"strategy": "prompt_lookup", "k_policy": "utility", "max_draft_tokens": 8}
    if strategy == "auto":
        settings = {"strategy": "auto", "max_draft_tokens": 8}
    extra = {"draft_model": model} if strategy == "draft_model" else {}
    captures = []
    for _ in range(2):
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, custom_generate=hsv.generate,
            speculation=settings, return_dict_in_generate=True, **extra,
        )  # fmt: skip
        assert torch.equal(out.sequences, plain)
        captures.append(out.speculation.graph_capture_s)
    if obstacle is None:
        assert captures[0] > 0 and captures[1] == 0, (
            captures
        )  # segment graphs ran, and were kept across calls
    else:
        assert captures == [0.0, 0.0]


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("strategy", [*STRATEGIES, "auto"])
def test_device_map_over_two_gpus_equals_plain(strategy):
    """Layer 0 on GPU 0, layers 1-2 and the head on GPU 1: two device segments."""
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 1,
                  "model.layers.2": 1, "model.norm": 1, "lm_head": 1}  # fmt: skip
    _split_equals_plain(device_map, strategy, None)


@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 4), reason="needs four CUDA GPUs"
)
@pytest.mark.parametrize("strategy", ["prompt_lookup", "vegas", "auto"])
def test_device_map_alternating_over_four_gpus_equals_plain(strategy):
    """Segments of one layer each, GPU 0 -> 3 -> 1 (a device's layers need not be one run)."""
    device_map = {"model.embed_tokens": 2, "model.rotary_emb": 2, "model.layers.0": 0, "model.layers.1": 3,
                  "model.layers.2": 1, "model.norm": 2, "lm_head": 2}  # fmt: skip
    _split_equals_plain(device_map, strategy, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_device_map_gpu_and_cpu_equals_plain(strategy):
    """Layer 1 and the head offloaded to the CPU (accelerate keeps their weights on the meta device and streams them
    to the GPU for each forward): eager steps on the GPU."""
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                  "model.layers.2": "cpu", "model.norm": "cpu", "lm_head": "cpu"}  # fmt: skip
    _split_equals_plain(device_map, strategy, "beside the GPU")


def test_auto_backend_is_reference_where_steps_run_eagerly(monkeypatch):
    """``attention_backend="auto"`` on a CUDA model: ``triton`` where the steps run on graphs; ``reference`` where they
    run eagerly (cuda_graphs=False, or a graph obstacle such as a device map), except for the self-speculative
    strategies, whose drafts read a selection of the cache."""
    import importlib
    import types

    from hf_sparse_verify.config import SpeculationConfig

    generate_module = importlib.import_module(
        "hf_sparse_verify.generation.generate"
    )  # the package exports a function

    if not generate_module.HAVE_TRITON:
        pytest.skip("no Triton")
    weight = types.SimpleNamespace(device=torch.device("cuda"))
    model = types.SimpleNamespace(get_input_embeddings=lambda: types.SimpleNamespace(weight=weight))
    obstacle = [None]
    monkeypatch.setattr(generate_module, "_graph_obstacle", lambda m: obstacle[0])

    def backend(**settings):
        return generate_module._backend(SpeculationConfig(**settings), model)

    assert backend(strategy="prompt_lookup") == "triton"
    assert backend(strategy="prompt_lookup", cuda_graphs=False) == "reference"
    assert backend(strategy="draft_model", cuda_graphs=False) == "reference"
    assert backend(strategy="vegas", cuda_graphs=False) == "triton"
    obstacle[0] = "spans 2 GPUs"
    assert backend(strategy="prompt_lookup") == "reference"
    assert backend(strategy="streaming") == "triton"
    assert (
        backend(strategy="prompt_lookup", attention_backend="triton") == "triton"
    )  # an explicit choice stands
