"""Every way hf_sparse_verify enters a transformers model, and the one switch that applies them for a call.

- `switch.speculation_mode` (with its `Mode`): the one scoped, logged, reversible switch. It sets the
  ``"sparse_verify"`` attention, replaces modules (one walk against `switch.RULES`) and, through
  `Switched.decoding_experts`, the experts implementation of decoding steps.
- Module replacements, each sharing the original's weights and computing what it computes: `FusedDecoderLayer`
  (`decoder_layer`), `FusedQKVAttention` (`qkv_attention`), `TritonRMSNorm` and `TritonRMSNormGated` (`rms_norm`),
  `GatedMLP` (`mlp`, also the lossy sparse FFN), `FusedRouter` (`router`), and the attention modules that bypass
  `AttentionInterface` (`falcon`, `gptj`, `codegen`, `gpt_neo`, `bloom`, `mpt`, `xglm`, `gpt_neox_japanese`)
  replaced by ones that dispatch through it; on a model over several GPUs,
  `SegmentLayer` (`segments`) around each decoder layer, so steps run as one CUDA graph per device segment.
- The experts interface: our fused Triton experts, ``"hsv_fused"`` (`fused_experts`), and the decoding-step choice
  (`experts`).

Tensor-parallel models (weights sharded as DTensors by ``tp_plan="auto"``) are first put on their local shards for
the call (`tensor_parallel`: local ``nn.Linear``s, all-reduces and gathers as explicit `torch.distributed` calls),
so the replacements above apply to them as on one GPU; models with sharded modules it does not cover keep transformers'
modules. Modules that accelerate hooks or whose weights are offloaded are left alone
(`hf_sparse_verify.placement.swappable`): a replacement would not carry the hook.
"""

from .bloom import BloomAttentionDispatch
from .codegen import CodeGenAttentionDispatch
from .decoder_layer import FusedDecoderLayer, replaceable_decoder_layer
from .experts import decoding_implementation, decoding_plan
from .falcon import FalconAttentionDispatch
from .fused_experts import NAME as FUSED_EXPERTS
from .fused_experts import fused_experts_forward, record_layers, supports
from .gpt_neo import GPTNeoAttentionDispatch
from .gpt_neox_japanese import GPTNeoXJapaneseAttentionDispatch
from .gptj import GPTJAttentionDispatch
from .mlp import GatedMLP, replaceable_mlp
from .mpt import MptAttentionDispatch
from .qkv_attention import FusedQKVAttention
from .rms_norm import TritonRMSNorm, TritonRMSNormGated
from .router import FusedRouter
from .segments import SegmentLayer
from .switch import ATTENTION_REPLACEMENTS, RULES, Mode, Switched, plan_swaps, speculation_mode
from .xglm import XGLMAttentionDispatch

__all__ = [
    "ATTENTION_REPLACEMENTS",
    "CodeGenAttentionDispatch",
    "FUSED_EXPERTS",
    "FalconAttentionDispatch",
    "FusedDecoderLayer",
    "FusedQKVAttention",
    "FusedRouter",
    "GPTJAttentionDispatch",
    "BloomAttentionDispatch",
    "GPTNeoAttentionDispatch",
    "MptAttentionDispatch",
    "GPTNeoXJapaneseAttentionDispatch",
    "XGLMAttentionDispatch",
    "GatedMLP",
    "Mode",
    "RULES",
    "SegmentLayer",
    "Switched",
    "TritonRMSNorm",
    "TritonRMSNormGated",
    "decoding_implementation",
    "decoding_plan",
    "fused_experts_forward",
    "plan_swaps",
    "record_layers",
    "replaceable_decoder_layer",
    "replaceable_mlp",
    "speculation_mode",
    "supports",
]
