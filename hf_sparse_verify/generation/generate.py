"""Entry points: the ``custom_generate`` callable and the raw-argument entry behind the Hub folder and the CLI.

Usage:
    model.generate(**inputs, custom_generate=hf_sparse_verify.generate, speculation=cfg, max_new_tokens=64)

transformers prepares inputs, the generation config, logits processors and stopping criteria as for any
decoding mode, then calls :func:`generate`, which runs hf_sparse_verify's own loop.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from transformers.cache_utils import Cache
from transformers.generation.stopping_criteria import StoppingCriteriaList, StopStringCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .. import _compat
from ..config import SpeculationConfig
from ..integrations import Mode, speculation_mode
from ..integrations.tensor_parallel import local_shard_swaps
from ..kernels._triton import HAVE_TRITON
from ..placement import graph_obstacle, tensor_parallel
from ..registry import DRAFTERS, resolve
from ..sparse.calibration import GRANTS, SparseCalibration, find_calibration
from .drafters.base import Drafter
from .drafters.low_bit import AUTO_FORMATS, draft_weights_for
from .drafters.portfolio import VEGAS_MIN_PROMPT, PortfolioDrafter
from .engine.loop import LoopSettings, speculative_decode
from .engine.stats import SpeculationStats
from .policies.k_policy import KPolicy, make_k_policy
from .policies.planner import PLAN_SHARE, Planner
from .policies.remote import remote_planner
from .profiles import profile_for

logger = logging.getLogger(__name__)

#: K policies that learn (``utility``) start a request from what the previous request on the same model and
#: strategy learnt: (id(model), strategy, k_policy) -> (best K, K = 0 steps still due when it ended switched off,
#: the K it ended speculating at).
#: The K never changes the output.
_POLICY_MEMORY: dict[tuple, tuple[int | None, int | None, int | None]] = {}
#: and, from a request of the same batch size and prompt length within 2x, the K = 0 step time and its age in
#: steps (so a short request does not spend its first steps re-measuring it): key + (batch, length bucket) ->
#: (seconds, steps)
_BASELINE_MEMORY: dict[tuple, tuple[float, int]] = {}


def _model_key(model) -> tuple:
    """Which model a memory entry is for: ``id`` alone can be reused by a model loaded after this one is freed."""
    config = model.config.get_text_config()
    shape = tuple(getattr(config, name, None) for name in ("num_hidden_layers", "hidden_size", "vocab_size"))
    return (id(model), type(model).__name__, *shape, str(model.dtype))


#: model kwargs transformers prepares for every decoding mode; we read or ignore these
_PREPARED_KWARGS = {
    "attention_mask",
    "position_ids",
    "past_key_values",
    "cache",
    "use_cache",
    "logits_to_keep",
}


@dataclasses.dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus ``speculation``, the call's `SpeculationStats`."""

    speculation: SpeculationStats | None = None


def resolve_config(speculation, generation_config, model) -> SpeculationConfig:
    """The call's config: the argument, else ``generation_config.speculation``, else the model's, else defaults."""
    config = SpeculationConfig.coerce(speculation)
    if config is None:
        stored = getattr(generation_config, "speculation", None)
        if stored is None:
            stored = getattr(model.generation_config, "speculation", None)
        config = SpeculationConfig.coerce(stored) or SpeculationConfig()
    return config


def _vegas_joins(config: SpeculationConfig, model, settings: LoopSettings, prompt_len: int) -> bool:
    """Vegas is one of ``auto``'s drafters where its draft steps run on CUDA graphs (a CUDA model on one GPU, the
    ``triton`` backend), the prompt is long enough for its selection to skip most of it, and verification is
    dense (it ranks cached tokens by the verify pass's attention)."""
    sparse = config.lossy_sparse_verify
    return (
        settings.backend == "triton"
        and settings.cuda_graphs is not False
        and model.get_input_embeddings().weight.device.type == "cuda"
        and _graph_obstacle(model) is None
        and prompt_len >= VEGAS_MIN_PROMPT
        and not (sparse is not None and sparse.attention is not None)
        and not _compat.recurrent_layer_indices(
            model
        )  # its selection is per attention layer (short-convolution hybrids)
    )


def _planner(
    config: SpeculationConfig, drafter: PortfolioDrafter, model, batch: int, prompt_len: int
) -> KPolicy:
    """The planner of this call, on the profile of this model, drafter set and shape bucket (kept across calls;
    at first from the model's saved ``speculation_profile.json`` when it has one for this device and shape): in the
    planner process where ``config.planner_process`` asks for it and it is free, else in the loop. Tensor-parallel
    ranks plan in the loop with no planning share: their choices must not depend on their hosts' timings."""
    key = (*_model_key(model), drafter.session_key(), batch, prompt_len.bit_length())
    profile = profile_for(model, key, list(drafter.members), batch, prompt_len)
    members = drafter.planner_members()
    parallel = tensor_parallel(model)
    if config.planner_process and not parallel:
        remote = remote_planner(members, config.max_draft_tokens, batch, profile)
        if remote is not None:
            return remote
    share = None if parallel else PLAN_SHARE
    return Planner(members, config.max_draft_tokens, batch, profile, plan_share=share)


def build_drafter(config: SpeculationConfig, strategy: str, model, draft_model) -> Drafter:
    cls = resolve(DRAFTERS, strategy)
    if draft_model is not None and not cls.takes_draft_model:
        takers = sorted(name for name in DRAFTERS if resolve(DRAFTERS, name).takes_draft_model)
        use = " or ".join(f"strategy={name!r}" for name in takers)
        raise ValueError(
            f"a draft_model was passed but the strategy is {strategy!r}; use {use} (or 'auto'), or pass no "
            "draft_model / assistant_model"
        )
    if draft_model is not None:  # the draft runs through the same attention and cache as the target
        _compat.check_architecture(draft_model)
    return cls.from_config(config, target=model, draft_model=draft_model)


def _check_generation_config(generation_config, model_kwargs: dict) -> None:
    if generation_config.num_beams > 1:
        raise NotImplementedError(
            f"beam search (num_beams={generation_config.num_beams}) cannot be combined with speculative decoding: "
            "use num_beams=1"
        )
    if generation_config.num_return_sequences > 1:
        raise NotImplementedError(
            f"num_return_sequences={generation_config.num_return_sequences} is not supported: repeat the prompt "
            "in the batch instead"
        )
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(generation_config, flag, False):
            raise NotImplementedError(
                f"{flag}=True is not supported by hf_sparse_verify.generate; leave it off"
            )
    if model_kwargs.get("inputs_embeds") is not None:
        raise NotImplementedError("inputs_embeds are not supported: pass input_ids")
    for name in ("past_key_values", "cache"):  # the cache's name before / from transformers 5.24
        cache = model_kwargs.get(name)
        if cache is not None and (not isinstance(cache, Cache) or not _compat.cache_is_empty(cache)):
            raise NotImplementedError(
                f"continuing from a user-provided {name} is not supported: hf_sparse_verify builds its own "
                f"preallocated cache; pass no {name}"
            )
    # an empty dict is transformers' placeholder for absent pre-encoded multimodal inputs (mm_encoder_outputs)
    given = {k for k, v in model_kwargs.items() if v is not None and not (isinstance(v, dict) and not v)}
    unexpected = sorted(given - _PREPARED_KWARGS)
    if unexpected:
        raise ValueError(f"unsupported model inputs for hf_sparse_verify.generate: {unexpected}")


def _graph_obstacle(model) -> str | None:
    """`graph_obstacle` of ``model`` as a call runs it: a tensor-parallel model that `speculation_mode` puts on its
    local shards has none."""
    return None if local_shard_swaps(model)[0] else graph_obstacle(model)


def _backend(config: SpeculationConfig, model) -> str:
    """``"auto"``: ``triton`` where the steps run on CUDA graphs (one GPU, or one graph per device segment over several);
    where they run eagerly on a GPU (``cuda_graphs=False``, offloaded or tensor-parallel models) ``reference`` for the strategies that draft without
    reading the target's cache, since an eager step pays every launch's host cost and the Triton path launches more
    (one H200, 8B shape, bf16, 64 new tokens, prompt lookup, eager: 25.0 against 43.3 ms per step at batch 1, 33.7
    against 62.9 at batch 3; `results/device_map.json (record eager_backends)`); ``reference`` off CUDA."""
    if config.attention_backend != "auto":
        return config.attention_backend
    if model.get_input_embeddings().weight.device.type != "cuda":
        return "reference"
    if not HAVE_TRITON:
        return "token_sparse"
    eager = config.cuda_graphs is False or _graph_obstacle(model) is not None
    reads_cache = config.strategy != "auto" and resolve(DRAFTERS, config.strategy).reads_target_cache
    return "reference" if eager and not reads_cache else "triton"


def _settings(config: SpeculationConfig, generation_config, model, prompt_len: int) -> LoopSettings:
    max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if max_positions is not None and prompt_len > max_positions:
        raise ValueError(
            f"the prompt has {prompt_len} tokens but the model has {max_positions} positions: shorten the prompt"
        )
    needed = generation_config.max_length + config.max_draft_tokens
    if config.max_cache_len is not None and needed > config.max_cache_len:
        raise ValueError(
            f"max_cache_len={config.max_cache_len} is too small: prompt ({prompt_len}) + new tokens "
            f"({generation_config.max_length - prompt_len}) + max_draft_tokens ({config.max_draft_tokens}) = "
            f"{needed} slots; raise max_cache_len or lower max_new_tokens"
        )
    pad = generation_config._pad_token_tensor
    eos = generation_config._eos_token_tensor
    if pad is None:
        pad = eos.flatten()[0] if eos is not None else torch.tensor(0)
    return LoopSettings(
        max_length=generation_config.max_length,
        max_draft_tokens=config.max_draft_tokens,
        do_sample=bool(generation_config.do_sample),
        pad_token_id=int(pad.flatten()[0]),
        backend=_backend(config, model),
        cache_len=config.max_cache_len or needed,
        fixed_cache_len=config.max_cache_len is not None,
        cuda_graphs=config.cuda_graphs,
        sparse=config.lossy_sparse_verify,
        calibration=_calibration(config, model),
    )


def granted_config(config: SpeculationConfig, model) -> SpeculationConfig:
    """``config`` with the lossy setting its ``quality_calibration`` grants its precision (`SparseCalibration.granted`)
    where it grants one; a ``lossy_sparse_verify`` set together with ``quality_calibration`` must be one the
    calibration graded a class the precision admits. Unchanged without ``quality_calibration``."""
    location = config.quality_calibration
    if location is None:
        return config
    calibration = SparseCalibration.load(location)
    layers = model.config.get_text_config().num_hidden_layers
    if calibration.num_layers != layers:
        raise ValueError(
            f"quality_calibration {location} is for a model of {calibration.num_layers} layers, this one has "
            f"{layers}: grade this model (hf-sparse-verify calibrate --grade)"
        )
    if config.lossy_sparse_verify is not None:
        if not calibration.graded(config.lossy_sparse_verify, config.precision):
            raise ValueError(
                f"lossy_sparse_verify is not a setting {location} grades {' or '.join(GRANTS[config.precision])}: "
                "leave lossy_sparse_verify unset (the calibration picks its granted setting), or set precision='fast'"
            )
        return config
    setting = calibration.granted(config.precision, location)
    if setting is None:
        logger.info("precision=%r: %s grants no lossy setting that class; verification stays dense",
                    config.precision, location)  # fmt: skip
        return config
    logger.info(
        "precision=%r: running the lossy setting %s granted (%s)", config.precision, location, setting
    )
    return dataclasses.replace(config, lossy_sparse_verify=setting)


def _calibration(config: SpeculationConfig, model):
    """The sparse-verification calibration these settings use (None for dense verification or when none is
    needed and none is found)."""
    sparse = config.lossy_sparse_verify
    if sparse is None:
        return None
    return find_calibration(sparse, model)


def _run(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    speculation,
    draft_model,
    streamer,
    model_kwargs,
):
    _compat.check_architecture(model)
    _check_generation_config(generation_config, model_kwargs)
    config = granted_config(resolve_config(speculation, generation_config, model), model)
    strategy = config.strategy
    sparse = config.lossy_sparse_verify
    if (
        strategy != "auto"
        and sparse is not None
        and sparse.attention is not None
        and resolve(DRAFTERS, strategy).needs_dense_verify_attention
    ):
        fine = sorted(name for name in DRAFTERS if not resolve(DRAFTERS, name).needs_dense_verify_attention)
        raise ValueError(
            f"strategy={strategy!r} ranks cached tokens by the verify pass's attention over the whole cache, which "
            f"lossy_sparse_verify.attention skips: use one of {fine} with sparse attention, or set "
            "lossy_sparse_verify.attention=None"
        )
    settings = _settings(config, generation_config, model, input_ids.shape[1])
    batch, prompt_len = input_ids.shape
    if config.draft_weights == "auto":  # the copy measured faster for this many rows, or the model's own
        weights = draft_weights_for(model, "auto", config.draft_weight_group, batch)
        if weights is None and strategy != "auto" and resolve(DRAFTERS, strategy).drafts_on_a_copy:
            weights = AUTO_FORMATS[-1]  # its draft is the copy: the one whose kernel holds to the most rows
        config = dataclasses.replace(config, draft_weights=weights)
    if strategy == "auto":
        if draft_model is not None:
            _compat.check_architecture(draft_model)
        drafter = PortfolioDrafter.from_config(
            config, model, draft_model, vegas=_vegas_joins(config, model, settings, prompt_len)
        )
        # auto picks K itself; k_policy="plain" still asks for no speculation
        policy = (
            make_k_policy(config)
            if config.k_policy == "plain"
            else _planner(config, drafter, model, batch, prompt_len)
        )
    else:
        drafter = build_drafter(config, strategy, model, draft_model)
        policy = make_k_policy(config)
    memory_key = (*_model_key(model), strategy, config.k_policy)
    # the K = 0 step time only carries to a request of the same batch size and prompt length within 2x
    shape_key = (*memory_key, batch, prompt_len.bit_length())
    policy.warm_start(*_POLICY_MEMORY.get(memory_key, (None, None, None)), _BASELINE_MEMORY.get(shape_key))
    eos = generation_config._eos_token_tensor
    eos_ids = [] if eos is None else [int(t) for t in eos.flatten().tolist()]
    k_policy = "planner" if policy.plans_drafters else config.k_policy
    stats = SpeculationStats(strategy=strategy, k_policy=k_policy)
    models = (model, *drafter.models)
    mode = Mode(
        fused=config.fused_modules and settings.backend == "triton",
        sparse_ffn=sparse is not None and sparse.ffn is not None,
        expert_skipping=sparse is not None and sparse.moe is not None,
        device_segments=settings.cuda_graphs is not False and settings.backend == "triton",
    )
    with speculation_mode(*models, mode=mode) as switched:
        sequences, stats = speculative_decode(
            model,
            input_ids,
            model_kwargs.get("attention_mask"),
            drafter=drafter,
            policy=policy,
            processors=logits_processor,
            stopping_criteria=stopping_criteria,
            eos_token_ids=eos_ids,
            settings=settings,
            streamer=streamer,
            switched=switched,
            stats=stats,
        )
    _POLICY_MEMORY[memory_key] = (policy.recent_best_k(), policy.switched_off_steps(), policy.speculating_k())
    baseline = policy.remembered_baseline()
    if baseline is not None:
        _BASELINE_MEMORY[shape_key] = baseline
    if generation_config.return_dict_in_generate:
        return SpeculativeDecoderOnlyOutput(sequences=sequences, speculation=stats)
    return sequences


@torch.no_grad()
def generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    synced_gpus: bool = False,
    streamer=None,
    speculation: SpeculationConfig | dict | None = None,
    draft_model=None,
    **model_kwargs,
):
    """Speculative decoding as a transformers ``custom_generate`` callable.

    Use through ``model.generate(**inputs, custom_generate=hf_sparse_verify.generate, speculation=cfg, ...)``;
    every standard argument (``max_new_tokens``, ``do_sample``, processors, ``eos_token_id``, ``streamer``,
    ``return_dict_in_generate``, ...) keeps its meaning. ``speculation`` is a `SpeculationConfig`, a dict, or
    omitted (then ``model.generation_config.speculation``, else defaults). ``draft_model`` is a loaded draft model;
    transformers' own ``assistant_model=`` is taken as the same thing. Calling ``generate(model, input_ids, ...)``
    directly goes through ``model.generate`` the same way.

    Returns:
        ``[B, T]`` sequences, or a `SpeculativeDecoderOnlyOutput` with ``speculation`` stats when
        ``return_dict_in_generate=True``.
    """
    if generation_config is None or logits_processor is None or stopping_criteria is None:
        # called directly: let transformers prepare everything, then come back here
        if streamer is not None:
            model_kwargs["streamer"] = streamer
        return type(model).generate(
            model,
            input_ids,
            custom_generate=generate,
            speculation=speculation,
            draft_model=draft_model,
            **model_kwargs,
        )
    if streamer is None:
        streamer = _compat.recover_streamer()
    draft_model = _draft_or_assistant(draft_model, _compat.recover_assistant_model())
    return _run(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        speculation,
        draft_model,
        streamer,
        model_kwargs,
    )


def _draft_or_assistant(draft_model, assistant_model):
    """transformers' ``assistant_model=`` is taken as the draft model (``strategy="auto"`` then picks
    ``draft_model``; another strategy refuses it in `build_drafter`)."""
    if assistant_model is None or assistant_model is draft_model:
        return draft_model
    if draft_model is not None:
        raise ValueError("pass either draft_model or assistant_model, not both")
    return assistant_model


def _bound_generate(streamer):
    """A ``custom_generate`` callable carrying a streamer that transformers would otherwise drop."""

    @torch.no_grad()
    def run(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus=False,
        speculation=None,
        draft_model=None,
        **model_kwargs,
    ):
        if streamer is not None:
            streamer.put(input_ids.cpu())  # transformers streams the prompt only when it holds the streamer
        return generate(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus,
            streamer,
            speculation,
            draft_model,
            **model_kwargs,
        )

    return run


def generate_from_arguments(model, inputs=None, **kwargs):
    """Speculative generation from raw ``generate`` arguments (what a Hub ``custom_generate/generate.py``
    receives, and what the CLI passes). Unlike the callable form it also accepts ``stop_strings`` with
    ``tokenizer``, and ``assistant_model`` as the draft model."""
    streamer = kwargs.pop("streamer", None)
    tokenizer = kwargs.pop("tokenizer", None)
    stop_strings = kwargs.pop("stop_strings", None)
    assistant_model = kwargs.pop("assistant_model", None)
    for unused in ("custom_generate", "trust_remote_code"):
        kwargs.pop(unused, None)
    if assistant_model is not None:
        if kwargs.get("draft_model") is not None:
            raise ValueError("pass either draft_model or assistant_model, not both")
        kwargs["draft_model"] = assistant_model
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need the tokenizer: pass tokenizer=... as well")
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
        kwargs["stopping_criteria"] = criteria
    # the class's generate: a model loaded from a repo with custom_generate/ has this very function bound as its
    # instance `generate`
    return type(model).generate(model, inputs, custom_generate=_bound_generate(streamer), **kwargs)
