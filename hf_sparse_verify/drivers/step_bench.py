"""``hf-sparse-verify bench step``: time one forward step (1..16 new tokens per row over a cache of ``context``
tokens) with our fast path and with plain transformers eager, next to the bandwidth floor.

- ours: `ModelRunner` on the ``triton`` attention backend with the fused RMSNorm modules, each width a captured
  CUDA graph (on CUDA), the call timed as the engine makes it (token ids in, float32 logits out);
- transformers: ``model(input_ids, cache=DynamicCache, logits_to_keep=new_tokens)`` (``past_key_values=`` before
  5.24) with SDPA, the cache cropped back after each call (untimed);
- floor: (weight bytes the step must read, for MoE layers the distinct experts a uniform router touches on
  average, + KV bytes) / measured copy bandwidth (`shapes.weight_bytes_per_step`).

Both caches hold random keys and values (step time does not depend on their values). Each figure is the median of
``--repeats`` calls after warm-ups, host clock around a synchronized call.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
from dataclasses import dataclass

import torch
from tqdm import tqdm

from .._compat import CACHE_KWARG, kv_shared_sources
from ..generation.engine.runner import ModelRunner
from ..integrations import Mode, speculation_mode
from ..step import Phase, ScoreCollection
from .machine import copy_bandwidth, machine_info, median, time_calls
from .shapes import kv_bytes, random_model, weight_bytes_per_step


@dataclass(frozen=True)
class StepBenchArgs:
    shape: str
    contexts: tuple[int, ...]
    new_tokens: tuple[int, ...]
    batches: tuple[int, ...] = (1,)
    device: str = "cuda"
    dtype: str = "bfloat16"
    repeats: int = 10
    warmups: int = 3
    transformers: bool = True
    cuda_graphs: bool = True
    vegas_scores: bool = False  # also time steps that collect Vegas' Collect-2-Query scores
    fused_attention: bool = True  # FusedQKVAttention on the fast path (Mode.fused_parts)
    fused_router: bool = True  # FusedRouter on the fast path (Mode.fused_parts)
    fused_layers: bool = True  # FusedDecoderLayer on the fast path (Mode.fused_parts)

    def __post_init__(self) -> None:
        if not self.contexts or min(self.contexts) < 1:
            raise ValueError(f"--context needs positive token counts, got {self.contexts}")
        if not self.new_tokens or not all(1 <= n <= 32 for n in self.new_tokens):
            raise ValueError(f"--new-tokens takes values in 1..32, got {self.new_tokens}")
        if not self.batches or min(self.batches) < 1:
            raise ValueError(f"--batch needs positive sizes, got {self.batches}")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"--dtype must be bfloat16, float16 or float32, got {self.dtype!r}")


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _ours(
    model, context: int, batch: int, widths, args: StepBenchArgs, device, bar
) -> tuple[dict, dict, str]:
    """Median ms per step of each width on our runner (without and with Vegas score collection), and the mode
    (``graph`` or ``eager``)."""
    backend = "triton" if device.type == "cuda" else "reference"
    vocab = model.config.get_text_config().vocab_size
    times, collect_times = {}, {}
    parts = {"norm", "mlp"} | {
        part
        for part, on in (
            ("attention", args.fused_attention),
            ("router", args.fused_router),
            ("decoder_layer", args.fused_layers),
        )
        if on
    }
    # over several GPUs (an accelerate device map) the steps run one graph per device segment
    mode = Mode(fused=backend == "triton", fused_parts=frozenset(parts), device_segments=True)
    with speculation_mode(model, mode=mode) as switched, switched.decoding_experts():
        runner = ModelRunner(model, batch, context + max(widths), device, backend)
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        runner.forward(torch.zeros(batch, 1, dtype=torch.long, device=device), zeros, Phase.PREFILL, kv_len=1)
        fill_random_kv(runner.cache)
        scores = None
        if args.vegas_scores:
            scores = ScoreCollection("two_rows", weights=True)
            capacity = runner.cache.capacity
            devices = runner.cache.layer_devices(device)
            scores.fix_buffers({layer: ((batch, capacity), d) for layer, d in enumerate(devices)})
        mode = "eager"
        if args.cuda_graphs and runner.can_capture() and runner.capture(widths):
            mode = "graph"
            if scores is not None and not runner.capture(widths, Phase.VERIFY, scores=scores):
                mode = "eager"
        start = torch.full((batch,), context, dtype=torch.long, device=device)
        for width in widths:
            ids = torch.randint(0, vocab, (batch, width), device=device)
            call = functools.partial(runner.forward, ids, start, Phase.VERIFY, kv_len=context + width)
            times[width] = 1000 * median(time_calls(call, device, args.warmups, args.repeats))
            if scores is not None:
                call = functools.partial(
                    runner.forward, ids, start, Phase.VERIFY, kv_len=context + width, scores=scores
                )
                collect_times[width] = 1000 * median(time_calls(call, device, args.warmups, args.repeats))
            bar.update(1)
    _free(device)
    return times, collect_times, mode


def fill_random_kv(cache) -> None:
    """Random keys and values in every slot of ``cache`` (a `SpecCache`; recurrent layers have none)."""
    for layer in cache.layers:
        for kv in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(kv, torch.Tensor):
                kv.normal_()


def our_step_ms(
    model, context: int, batch: int, widths, device, repeats: int = 10, warmups: int = 3
) -> tuple[dict, str]:
    """Median ms of our step of each width in ``widths`` over a cache of ``context`` random tokens per row, as the
    engine runs it (graphs where they capture: one per step on one GPU, one per device segment over several);
    and the mode (``graph`` or ``eager``)."""
    args = StepBenchArgs(
        shape="given", contexts=(context,), new_tokens=tuple(widths), repeats=repeats, warmups=warmups
    )
    with tqdm(total=len(widths), desc="our steps", file=sys.stderr) as bar:
        times, _, mode = _ours(model, context, batch, sorted(set(widths)), args, torch.device(device), bar)
    return times, mode


def _transformers(
    model, context: int, batch: int, widths, args: StepBenchArgs, device, bar, ranks: int = 1
) -> tuple[dict, int | None]:
    """Median ms per step of each width with plain transformers eager (SDPA, DynamicCache; a rank's share of the
    KV heads under tensor parallelism), and the bytes of its cache that a step reads and writes at least (None
    where not counted: see `_cache_bytes`).

    Models whose layers are all full attention get random keys and values; others (recurrent, sliding-window or
    KV-shared layers) are prefilled with ``context`` random tokens so that every cache layer holds what it holds in
    decoding. After each timed call the full-attention layers are cropped back (untimed); recurrent and
    sliding-window layers keep their size (their step cost does not depend on their contents)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    config = model.config.get_text_config()
    cache = DynamicCache(config=model.config)
    dtype = model.dtype
    plain = all(type(layer) is DynamicLayer for layer in cache.layers) and not kv_shared_sources(model)
    if plain:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (batch, config.num_key_value_heads // ranks, context, head_dim)
        for layer in range(config.num_hidden_layers):
            cache.update(
                torch.randn(shape, device=device, dtype=dtype),
                torch.randn(shape, device=device, dtype=dtype),
                layer,
            )
        moved = None
    else:
        prompt = torch.randint(0, config.vocab_size, (batch, context), device=device)
        model(input_ids=prompt, **{CACHE_KWARG: cache}, use_cache=True, logits_to_keep=1)
        moved = _cache_bytes(model, cache)
    full = [
        layer
        for layer in cache.layers
        if isinstance(layer, DynamicLayer) and not isinstance(layer, DynamicSlidingWindowLayer)
    ]

    def crop() -> None:  # drop the step's tokens from the full-attention layers (untimed)
        for layer in full:
            if layer.is_initialized and layer.keys.shape[-2] > context:
                DynamicLayer.crop(layer, context - layer.keys.shape[-2])

    times = {}
    for width in widths:
        ids = torch.randint(0, config.vocab_size, (batch, width), device=device)
        call = functools.partial(
            model, input_ids=ids, **{CACHE_KWARG: cache}, use_cache=True, logits_to_keep=width
        )
        runs = time_calls(call, device, args.warmups, args.repeats, after=crop)
        times[width] = 1000 * median(runs)
        bar.update(1)
    del cache
    _free(device)
    return times, moved


def _cache_bytes(model, cache) -> int:
    """The least a step reads and writes of a prefilled transformers ``cache``: every attention layer's keys and
    values (a sliding-window layer's window; a KV-shared layer reads its source layer's again), and every recurrent
    layer's states read and written once."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    total = 0
    sizes = {}
    for index, layer in enumerate(cache.layers):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and getattr(layer, "is_initialized", False):
            sizes[index] = keys.nbytes + layer.values.nbytes
            total += sizes[index]
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for states in (layer.conv_states, layer.recurrent_states):
                for state in states if isinstance(states, (list, tuple)) else [states]:
                    if isinstance(state, torch.Tensor):
                        total += 2 * state.nbytes
    for source in kv_shared_sources(model).values():
        total += sizes.get(source, 0)
    return total


@torch.no_grad()
def run(args: StepBenchArgs) -> dict:
    device = torch.device(args.device)
    return run_on(random_model(args.shape, device, getattr(torch, args.dtype)), args, device)


@torch.no_grad()
def run_on(model, args: StepBenchArgs, device: torch.device, ranks: int = 1) -> dict:
    """`run` on a model already built (e.g. loaded with ``tp_plan="auto"``; ``args.shape`` names it). ``ranks``:
    the tensor-parallel ranks sharing its weights and cache; the floor is one rank's share of the bytes."""
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else None
    widths = sorted(set(args.new_tokens))
    records = []
    total = len(args.contexts) * len(args.batches) * len(widths) * (2 if args.transformers else 1)
    with tqdm(total=total, desc=f"bench step {args.shape}", file=sys.stderr) as bar:
        for context in args.contexts:
            for batch in args.batches:
                ours, ours_collect, mode = _ours(model, context, batch, widths, args, device, bar)
                _free(device)  # our runner's cache is gone only now
                theirs, cache_moved = (
                    _transformers(model, context, batch, widths, args, device, bar, ranks)
                    if args.transformers
                    else ({}, None)
                )
                if cache_moved is None:
                    cache_moved = kv_bytes(model, context, batch, dtype)
                for width in widths:
                    moved = weight_bytes_per_step(model, width, batch) + cache_moved
                    floor_ms = 1000 * moved / ranks / bandwidth if bandwidth else None
                    record = dict(
                        context=context,
                        new_tokens=width,
                        batch=batch,
                        ours_ms=round(ours[width], 4),
                        ours_mode=mode,
                        transformers_ms=round(theirs[width], 4) if width in theirs else None,
                        floor_ms=round(floor_ms, 4) if floor_ms else None,
                        bytes_moved=moved,
                        tokens_per_s=round(batch * width * 1000 / ours[width], 1),
                    )
                    if floor_ms:
                        record["ours_over_floor"] = round(ours[width] / floor_ms, 3)
                    if width in theirs:
                        record["transformers_over_ours"] = round(theirs[width] / ours[width], 3)
                    if 1 in ours:
                        record["ours_over_our_decode"] = round(ours[width] / ours[1], 3)
                    if width in ours_collect:
                        record["ours_vegas_scores_ms"] = round(ours_collect[width], 4)
                        record["vegas_scores_overhead"] = round(ours_collect[width] / ours[width] - 1, 4)
                    records.append(record)
    return dict(
        machine=machine_info(device),
        shape=args.shape,
        dtype=args.dtype,
        copy_bandwidth_GBps=round(bandwidth / 1e9, 1) if bandwidth else None,
        method=f"median of {args.repeats} calls after {args.warmups} warm-ups, host clock around a synchronized "
        "call; caches hold random keys and values (transformers' cache of a model with recurrent, sliding-window or "
        "KV-shared layers: prefilled with random tokens); floor = (weight bytes read + cache bytes read and "
        "written at least) / copy bandwidth"
        + (f" / {ranks} tensor-parallel ranks" if ranks > 1 else ""),
        records=records,
    )


def _cell(value, width: int) -> str:
    """A number to two decimals, or ``n/a`` where it was not measured."""
    if value is None or value != value:  # None or NaN
        return f"{'n/a':>{width}}"
    return f"{value:>{width}.2f}"


def table(result: dict) -> str:
    """A plain-text table of the records (``n/a`` where a figure was not measured: floors need a CUDA device)."""
    bandwidth = result["copy_bandwidth_GBps"]
    lines = [
        f"{result['shape']} {result['dtype']} on {result['machine']['gpu'] or result['machine']['device']}, "
        f"copy {'n/a (CUDA only)' if bandwidth is None else f'{bandwidth} GB/s'}",
        "context  batch  new  ours_ms  mode   transformers_ms  floor_ms  ours/floor  theirs/ours  ours/decode",
    ]
    for r in result["records"]:
        lines.append(
            f"{r['context']:>7}  {r['batch']:>5}  {r['new_tokens']:>3}  {r['ours_ms']:>7.2f}  {r['ours_mode']:<5}  "
            f"{_cell(r['transformers_ms'], 15)}  {_cell(r['floor_ms'], 8)}  {_cell(r.get('ours_over_floor'), 10)}  "
            f"{_cell(r.get('transformers_over_ours'), 11)}  {_cell(r.get('ours_over_our_decode'), 11)}"
        )
    return "\n".join(lines)


def main(args: StepBenchArgs, json_path: str | None) -> dict:
    result = run(args)
    print(table(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    return result
