"""Named model shapes with random weights: timings of a forward step do not depend on weight values, so these
stand in for the real checkpoints (which cannot be downloaded here) at their exact sizes."""

from __future__ import annotations

import torch

#: preset name -> (transformers config class name, config fields)
SHAPES: dict[str, tuple[str, dict]] = {
    "llama-3.1-8b": (
        "LlamaConfig",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_parameters={"rope_theta": 500000.0, "rope_type": "default"},
            tie_word_embeddings=False,
        ),
    ),
    "llama-3.1-70b": (  # about 141 GB of bf16 weights: two H200s or four H100s
        "LlamaConfig",
        dict(
            vocab_size=128256,
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_parameters={"rope_theta": 500000.0, "rope_type": "default"},
            tie_word_embeddings=False,
        ),
    ),
    "qwen3-30b-a3b": (
        "Qwen3MoeConfig",
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            max_position_embeddings=131072,
            rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
            tie_word_embeddings=False,
        ),
    ),
    # Qwen3-Next-80B-A3B (transformers' Qwen3NextConfig defaults are its sizes: 48 layers, every fourth full
    # attention, the others Gated DeltaNet) with 64 of its 512 experts per layer, so that it fits one 80 GB card
    "qwen3-next-80b-a3b-e64": ("Qwen3NextConfig", dict(num_experts=64, tie_word_embeddings=False)),
    # transformers' Qwen3_5TextConfig defaults: 32 layers of hidden size 4096 (8 full attention, 24 Gated DeltaNet),
    # about 9B parameters
    "qwen3.5-text-default": ("Qwen3_5TextConfig", dict()),
    # transformers' Gemma4TextConfig defaults: 30 layers of hidden size 2304, sliding-window (512) and global
    # layers (head size 512), per-layer input embeddings; no KV-shared layers (its default)
    "gemma-4-text-default": ("Gemma4TextConfig", dict()),
    # transformers' Gemma3nTextConfig defaults: its last layers read earlier layers' keys and values
    "gemma-3n-text-default": ("Gemma3nTextConfig", dict()),
    # small stand-ins with the same structure, for tests and CPU smoke runs
    "tiny-llama": (
        "LlamaConfig",
        dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
    ),
    "tiny-qwen3-next": (
        "Qwen3NextConfig",
        dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=8,
            num_experts_per_tok=2,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
    ),
    "tiny-qwen3-moe": (
        "Qwen3MoeConfig",
        dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
    ),
}


def shape_config(name: str):
    """The transformers config of preset ``name``."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: use one of {sorted(SHAPES)}")
    import transformers

    class_name, fields = SHAPES[name]
    return getattr(transformers, class_name)(**fields)


def random_model(name: str, device: str | torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Preset ``name`` with random weights, built directly on ``device`` in ``dtype`` (eval mode, SDPA attention)."""
    from transformers import AutoModelForCausalLM

    config = shape_config(name)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def expected_experts(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts a uniform router touches in one MoE layer, on average, for ``tokens`` tokens of ``top_k``
    distinct picks each: ``E (1 - (1 - k / E)^T)`` (each token picks a given expert with probability ``k / E``,
    tokens independently). One token gives ``k``; it stays below ``min(E, T k)`` from two tokens on (16 tokens of
    Qwen3-30B-A3B, 8 of 128: 82.4 experts, not 128).

    Example:
        >>> expected_experts(128, 8, 1), round(expected_experts(128, 8, 16), 1)
        (8.0, 82.4)
    """
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def weight_bytes_per_step(model: torch.nn.Module, new_tokens: int, batch: int) -> int:
    """Weight bytes one forward of ``batch x new_tokens`` tokens must read: every parameter except embedding tables
    (of which only the used rows are read: the input embedding and per-layer input embeddings such as Gemma 3n's
    and Gemma 4's), unless the output layer shares the table (then all of it); for MoE layers, the experts a
    uniform router touches on average (`expected_experts`). Random-weight routers route near uniformly; a trained
    router that concentrates tokens on fewer experts reads less."""
    config = model.config.get_text_config()
    total = 0
    output = model.get_output_embeddings()
    head = output.weight if output is not None else None
    tables = {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, torch.nn.Embedding) and module.weight is not head
    }
    tokens = new_tokens * batch
    experts = getattr(config, "num_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    share = expected_experts(experts, top_k, tokens) / experts if experts and top_k else 1.0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        if id(param) in tables:
            size = min(size, tokens * param.shape[1] * param.element_size())
        elif experts and ".experts." in name and param.dim() >= 3 and param.shape[0] == experts:
            size = int(size * share)
        total += size
    return total


def kv_bytes(model: torch.nn.Module, context: int, batch: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values of ``context`` cached tokens per row over the attention layers (all layers where
    the config names no layer types; a sliding-window layer's window; recurrent layers not counted)."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or context
    tokens = sum(
        min(context, window) if "sliding" in kind else context
        for kind in kinds
        if "attention" in kind and "linear" not in kind
    )
    per_token = 2 * config.num_key_value_heads * head_dim
    return per_token * tokens * batch * torch.empty((), dtype=dtype).element_size()
