"""`SpeculationConfig`: one frozen, validated description of how to speculate.

Example:
    >>> from hf_sparse_verify import SpeculationConfig
    >>> cfg = SpeculationConfig(strategy="prompt_lookup", num_draft_tokens=4)
    >>> cfg.num_draft_tokens
    4
    >>> SpeculationConfig.from_dict(cfg.to_dict()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from .registry import DRAFTERS, K_POLICIES
from .sparse.config import LossySparseVerify

CONFIG_NAME = "speculation_config.json"
ATTENTION_BACKENDS = ("auto", "reference", "token_sparse", "triton")
#: precision classes, strictest first: the loosest class of output quality the user accepts. ``exact`` runs only
#: lossless work (greedy output equals plain ``generate``); ``near_exact`` and ``balanced`` admit lossy settings that a
#: quality calibration granted that class (gates of issue 40: delta NLL, top-1, KL, flips, task score); ``fast``
#: admits any lossy setting, measured and reported but not gated
PRECISIONS = ("exact", "near_exact", "balanced", "fast")
SELECTIONS = ("two_rows", "all", "last_token")
VEGAS_SCORES = ("weights", "logits")
VEGAS_LSE = ("step", "carried")
_EXAMPLE_NAMES = {
    "strategy": "vegas",
    "k_policy": "constant",
    "selection": "two_rows",
    "attention_backend": "auto",
    "vegas_scores": "weights",
    "vegas_lse": "carried",
}


@dataclass(frozen=True)
class SpeculationConfig:
    """How `hf_sparse_verify.generate` drafts and verifies.

    Args:
        strategy: drafter name: ``"prompt_lookup"`` (n-gram lookup in the prompt and output), ``"draft_model"``
            (a smaller model with the same vocabulary), ``"vegas"`` / ``"streaming"`` / ``"quest"`` (the target
            drafts for itself with sparse attention, see `drafters/self_spec.py`) or ``"auto"`` (default: the planner,
            `hf_sparse_verify.generation.policies.planner`, picks at every step the measured fastest of prompt lookup,
            the draft model when one is given, Vegas on long prompts on a GPU, and a plain step, and its K; it
            chooses K itself, so ``k_policy`` applies to named strategies only, except ``"plain"``).
        num_draft_tokens: K, draft tokens per step for the ``constant`` policy and the starting K of the
            adaptive ones. Default 4.
        max_draft_tokens: upper bound on K for adaptive policies; the KV caches are sized with this slack.
            Default 16 (the verify kernels of later issues handle at most 16 query tokens per row).
        k_policy: ``"constant"``, ``"heuristic"`` (transformers' +2 / -1 rule), ``"utility"`` (Cascade) or
            ``"plain"`` (K = 0 at every step: no speculation, the engine's own baseline).
        draft_model: folder or Hub id of the draft model (``strategy="draft_model"``); a loaded model can be
            passed to ``generate(..., draft_model=obj)`` instead.
        draft_weights: the weights draft steps of the self-speculative strategies (``vegas``, ``streaming``,
            ``quest``) run: None (the model's own), ``"int4"`` (per group of ``draft_weight_group`` input channels)
            or ``"int8"`` (per output channel), a copy of the target's linear layers made once per target that
            shares its KV cache (verification keeps the model's weights: lossless). ``strategy="low_bit"`` drafts
            with such a copy and a KV cache of its own (None there means ``"int4"``). ``"auto"``: per call, int4
            where its matmul is measured faster than bf16 at the call's rows, else int8, else the model's own
            (`LowBitLinear.FASTER_ROWS`; on an H100 int4 to 4 rows, int8 to 16); each copy made once and kept.
        draft_weight_group: input channels per int4 scale; None (default): 128, or the largest of 64 and 32 that
            divides every rounded linear layer's input size (an explicit value must divide them all).
        prompt_lookup_max_ngram / prompt_lookup_min_ngram: n-gram sizes tried by ``prompt_lookup``, longest first.
        attention_backend: ``"auto"`` (``triton`` on CUDA; where the steps run eagerly on a GPU, that is with
            ``cuda_graphs=False`` or a model over several GPUs, offloaded or tensor-parallel, ``reference`` except
            for the self-speculative strategies, whose drafts read a selection of the cache; ``reference`` off
            CUDA), ``"reference"`` (plain
            PyTorch, exact, masks the whole cache), ``"token_sparse"`` (as reference, but draft steps gather only
            the selected slots) or ``"triton"`` (decode/verify steps of up to 16 tokens per row run the split-KV
            decode-attention kernel, with Vegas score collection fused; other steps as ``token_sparse``).
        cuda_graphs: the fast path: capture the target's decode and verify steps (one CUDA graph per query length
            1 .. K_max + 1, one shared memory pool) and the drafters' steps, and replay them; changing K never
            recaptures. None (default): on wherever it can run (CUDA with the ``triton`` backend), silently off
            elsewhere. True: asked for; where it cannot run (CPU, another backend) or capture fails (an unsupported
            module) the loop warns once and runs eagerly. False: always eager.
        planner_process: where ``strategy="auto"`` plans. False (default): in the decoding loop, while the device
            verifies each step. True: in a child process beside the loop (`generation/policies/remote.py`): the
            loop sends each step's outcome and takes the newest choice without waiting, so planning takes almost no
            host time from the steps (on small and medium models the host is what a step waits on); tensor-parallel
            ranks, whose choices must agree, still plan in the loop. Lossless either way. Measured on one H100
            (docs/results.md, run23) it did not pay: 0.72-0.92 of the best single strategy against 0.79-0.96 in
            the loop.
        fused_modules: on CUDA with the ``triton`` backend, run the model's Llama-family RMSNorms and bias-free SiLU
            gated MLPs on fused Triton kernels during the call (module replacement, undone on exit; the same
            arithmetic, summed in a different order). Default True.
        max_cache_len: fixed KV-cache slots per row (for example to keep buffer shapes stable across calls);
            None sizes the cache from prompt + max_new_tokens + max_draft_tokens. A call that needs more fails.
        ratio / min_tokens: self-speculative strategies (``vegas``, ``streaming``, ``quest``) draft with
            ``max(min_tokens, ceil(ratio * prefix length))`` cached tokens per layer (paper defaults 0.07, 256).
        selection: ``vegas`` scores: ``"two_rows"`` (first and last verify rows, Collect-2-Query), ``"all"``
            (every verify row, the paper's Eq. 2) or ``"last_token"`` (the last accepted token's row).
        vegas_scores: what ``vegas`` ranks cached tokens by: ``"weights"`` (default: the head mean of softmax
            weights, as the released Vegas code; heads with wide logit spreads no longer dominate) or ``"logits"``
            (the head mean of raw logits, the paper's text). Measured on code-target (CPU, fp32, 3K context, K = 6,
            ratio 0.07): mean acceptance 5.37 with weights against 4.32 with logits (two rows).
        vegas_lse: the normaliser of the ``vegas`` softmax weights. ``"step"``: each scored verify row's own
            log-sum-exp (exact weights; the Triton kernel stores the scored rows' logits and normalises them after
            the split merge, +26% of a 7-token verify step at 4 x 64K on an H200). ``"carried"``: per query head,
            the log-sum-exp of the previous verify step's first row, so the weights are summed inside the attention
            pass (approximate weights whose normaliser is one step old). Selection only steers the draft: either
            is lossless. Measured on an H200 (bf16 8B heads, 7-token verify, us per layer): no scores 298, step
            364, carried 341; code-target acceptance (fp32, 12 prompts, K = 6) step 6.26 / 6.37, carried 6.24 /
            6.21 at 8K / 16K. The saving does not pay for the acceptance lost, so ``"step"`` stays the default
            (a one-off diagnostic, kept in git history as benchmarks/results/h200_diag_vegas_lse.json).
        vegas_recent_share: share of the ``vegas`` budget always given to the most recent prefix tokens (the
            rest goes to the top-scoring ones); 0 is plain top-k. Default 0.875: measured on an H200 with
            code-target (fp32, 12 held-out prompts, K = 6, ratio 0.07, min_tokens 256), mean acceptance 5.61 /
            5.72 (plain top-k), 5.97 / 5.94 (0.5), 5.97 / 6.09 (0.75), 6.09 / 6.12 (0.875) at 8K / 16K context
            (benchmarks/results/long.json).
        vegas_pool: width of the max-pooling of the ``vegas`` scores over neighbouring prefix slots before the
            top-k (odd; 1: none), so the top-k keeps short spans around important tokens (SnapKV-style). Default
            7: on code-target (fp32, CPU, 12 held-out prompts, K = 6, ratio 0.07) mean acceptance 6.26 / 6.37 at
            8K / 16K against 6.09 / 6.12 without pooling, Streaming 6.01 / 6.21 and Quest 6.09 / 6.04
            (benchmarks/NOTES_vegas_scores.md).
        streaming_sinks / quest_page_size: sink tokens of ``streaming``, page size of ``quest``.
        precision: the loosest precision class the output may have (`PRECISIONS`). ``"exact"`` never runs
            anything lossy: greedy output equals plain ``generate`` token for token, and ``lossy_sparse_verify`` with
            it is an error. ``"near_exact"`` / ``"balanced"`` admit lossy settings that a quality calibration granted
            that class (``quality_calibration``); without one, or where it grants none, they run exactly as
            ``"exact"`` (a hand-set ``lossy_sparse_verify`` has no class and is refused with them, unless the
            calibration named in ``quality_calibration`` graded it so). ``"fast"`` admits any lossy setting,
            ungated. None (default): ``"fast"`` when ``lossy_sparse_verify`` is set, else ``"exact"``.
        quality_calibration: a ``sparse_verify_calibration.json`` (file or folder) whose ``grades`` (written by
            ``hf-sparse-verify calibrate --grade``) give candidate lossy settings their measured precision class;
            with ``precision="near_exact"`` or ``"balanced"`` the call runs the first setting it grants a class
            that precision admits (`SparseCalibration.granted`), else exact.
        lossy_sparse_verify: None (default): dense, lossless verification. A `LossySparseVerify` (or a dict):
            LOSSY sparse verification, skipping KV blocks in attention, FFN channels and/or routed experts in the
            verify pass (`hf_sparse_verify.sparse`); greedy output may then differ from plain ``generate``. Measure
            a setting with ``benchmarks/bench_sparse_quality.py`` before using it.
        utility_*: constants of the ``utility`` K policy (Cascade, paper defaults): trial length t, trials per
            test phase M, set-phase length S, first K tried, plain-decode steps measured at the start of a
            request and the refresh period of that measurement (a request of the same batch size and prompt
            length within 2x reuses the previous request's measurement until it is that many steps old), and the
            relative tolerance under which two utilities count as equal. A trial whose drafts were all accepted
            doubles K for the next trial (ours; see `UtilityKPolicy`).
    """

    strategy: str = "auto"
    num_draft_tokens: int = 4
    max_draft_tokens: int = 16
    k_policy: str = "constant"
    draft_model: str | None = None
    draft_weights: str | None = None
    draft_weight_group: int | None = None
    prompt_lookup_max_ngram: int = 3
    prompt_lookup_min_ngram: int = 1
    attention_backend: str = "auto"
    cuda_graphs: bool | None = None
    planner_process: bool = False
    fused_modules: bool = True
    max_cache_len: int | None = None
    ratio: float = 0.07
    min_tokens: int = 256
    selection: str = "two_rows"
    vegas_scores: str = "weights"
    vegas_lse: str = "step"
    vegas_recent_share: float = 0.875
    vegas_pool: int = 7
    streaming_sinks: int = 4
    quest_page_size: int = 16
    utility_trial_steps: int = 4
    utility_max_trials: int = 4
    utility_set_steps: int = 16
    utility_k_start: int = 3
    utility_baseline_steps: int = 4
    utility_baseline_refresh: int = 100
    utility_tolerance: float = 0.10
    lossy_sparse_verify: LossySparseVerify | None = None
    precision: str | None = None
    quality_calibration: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.lossy_sparse_verify, dict):
            object.__setattr__(
                self, "lossy_sparse_verify", LossySparseVerify.from_dict(self.lossy_sparse_verify)
            )
        elif self.lossy_sparse_verify is not None and not isinstance(
            self.lossy_sparse_verify, LossySparseVerify
        ):
            raise ValueError(
                "lossy_sparse_verify must be None (dense, lossless), a LossySparseVerify or a dict, got "
                f"{self.lossy_sparse_verify!r}"
            )
        if self.precision is None:  # the class follows from what is asked for
            object.__setattr__(self, "precision", "exact" if self.lossy_sparse_verify is None else "fast")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "exact" and self.lossy_sparse_verify is not None:
            raise ValueError(
                "precision='exact' never runs anything lossy, but lossy_sparse_verify is set: drop "
                "lossy_sparse_verify, or set precision='fast' to accept output that may differ from plain generate"
            )
        if self.quality_calibration is not None and self.precision not in ("near_exact", "balanced"):
            raise ValueError(
                "quality_calibration grants a lossy setting to precision='near_exact' or 'balanced'; set one of "
                f"them (precision is {self.precision!r}) or drop quality_calibration"
            )
        if (
            self.precision in ("near_exact", "balanced")
            and self.lossy_sparse_verify is not None
            and self.quality_calibration is None
        ):
            raise ValueError(
                f"precision={self.precision!r} admits only lossy settings a quality calibration granted that class, "
                "and a lossy_sparse_verify given by hand has no class: name the calibration that graded it "
                "(quality_calibration=...), set precision='fast' to run it ungated, or drop it"
            )
        for name in ("strategy", "k_policy", "selection", "attention_backend", "vegas_scores", "vegas_lse"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(
                    f"{name} is one name (a str such as {_EXAMPLE_NAMES[name]!r}), got {value!r}"
                )
        if self.strategy != "auto" and self.strategy not in DRAFTERS:
            raise ValueError(f"unknown strategy {self.strategy!r}: use 'auto' or one of {sorted(DRAFTERS)}")
        if self.k_policy not in K_POLICIES:
            raise ValueError(f"unknown k_policy {self.k_policy!r}: use one of {sorted(K_POLICIES)}")
        _check_int("num_draft_tokens", self.num_draft_tokens)
        _check_int("max_draft_tokens", self.max_draft_tokens)
        if self.k_policy == "constant" and self.num_draft_tokens < 1:
            raise ValueError(
                f"num_draft_tokens={self.num_draft_tokens} with k_policy='constant': a constant policy needs K >= 1 "
                "(for plain decoding call generate() without custom_generate)"
            )
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if not 1 <= self.max_draft_tokens <= 64:
            raise ValueError(f"max_draft_tokens must be in [1, 64], got {self.max_draft_tokens}")
        if self.num_draft_tokens > self.max_draft_tokens:
            raise ValueError(
                f"num_draft_tokens={self.num_draft_tokens} exceeds max_draft_tokens={self.max_draft_tokens}: "
                "raise max_draft_tokens or lower num_draft_tokens"
            )
        if self.draft_model is not None:
            if not isinstance(self.draft_model, str):
                raise ValueError(
                    "SpeculationConfig.draft_model is a folder or Hub id (str); pass a loaded model as "
                    "generate(..., draft_model=model) instead"
                )
            check_model_location("draft_model", self.draft_model)
        if self.draft_weights not in (None, "int8", "int4", "auto"):
            raise ValueError(
                f"draft_weights must be None, 'int8', 'int4' or 'auto', got {self.draft_weights!r}"
            )
        if self.draft_weight_group is not None:
            _check_int("draft_weight_group", self.draft_weight_group)
            if self.draft_weight_group < 2 or self.draft_weight_group % 2:
                raise ValueError(
                    f"draft_weight_group must be an even number >= 2, got {self.draft_weight_group}"
                )
        _check_int("prompt_lookup_max_ngram", self.prompt_lookup_max_ngram)
        _check_int("prompt_lookup_min_ngram", self.prompt_lookup_min_ngram)
        if not 1 <= self.prompt_lookup_min_ngram <= self.prompt_lookup_max_ngram:
            raise ValueError(
                "need 1 <= prompt_lookup_min_ngram <= prompt_lookup_max_ngram, got "
                f"{self.prompt_lookup_min_ngram} and {self.prompt_lookup_max_ngram}"
            )
        if self.max_cache_len is not None:
            _check_int("max_cache_len", self.max_cache_len)
            if self.max_cache_len < 1:
                raise ValueError(f"max_cache_len must be >= 1 or None, got {self.max_cache_len}")
        if (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, (int, float))
            or not 0.0 < self.ratio <= 1.0
        ):
            raise ValueError(f"ratio must be a number in (0, 1], got {self.ratio!r}")
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {self.min_tokens}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"unknown selection {self.selection!r}: use one of {SELECTIONS}")
        if (
            isinstance(self.vegas_recent_share, bool)
            or not isinstance(self.vegas_recent_share, (int, float))
            or not 0 <= self.vegas_recent_share < 1
        ):
            raise ValueError(
                f"vegas_recent_share must be a number in [0, 1), got {self.vegas_recent_share!r}"
            )
        if self.vegas_scores not in VEGAS_SCORES:
            raise ValueError(f"unknown vegas_scores {self.vegas_scores!r}: use one of {VEGAS_SCORES}")
        if self.vegas_lse not in VEGAS_LSE:
            raise ValueError(f"unknown vegas_lse {self.vegas_lse!r}: use one of {VEGAS_LSE}")
        if self.vegas_lse == "carried" and (self.vegas_scores != "weights" or self.selection == "last_token"):
            raise ValueError(
                "vegas_lse='carried' normalises softmax weights of reduced verify rows: it needs "
                f"vegas_scores='weights' and selection 'two_rows' or 'all' (got vegas_scores={self.vegas_scores!r}, "
                f"selection={self.selection!r}); use vegas_lse='step'"
            )
        _check_int("vegas_pool", self.vegas_pool)
        if self.vegas_pool < 1 or self.vegas_pool % 2 == 0:
            raise ValueError(f"vegas_pool must be an odd int >= 1 (1: no pooling), got {self.vegas_pool}")
        _check_int("streaming_sinks", self.streaming_sinks)
        if self.streaming_sinks < 0:
            raise ValueError(f"streaming_sinks must be >= 0, got {self.streaming_sinks}")
        _check_int("quest_page_size", self.quest_page_size)
        if self.quest_page_size < 1:
            raise ValueError(f"quest_page_size must be >= 1, got {self.quest_page_size}")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be None (auto), True or False, got {self.cuda_graphs!r}")
        if not isinstance(self.planner_process, bool):
            raise ValueError(f"planner_process must be True or False, got {self.planner_process!r}")
        if not isinstance(self.fused_modules, bool):
            raise ValueError(f"fused_modules must be True or False, got {self.fused_modules!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"unknown attention_backend {self.attention_backend!r}: use one of {ATTENTION_BACKENDS}"
            )
        for name in (
            "utility_trial_steps",
            "utility_max_trials",
            "utility_set_steps",
            "utility_k_start",
            "utility_baseline_steps",
            "utility_baseline_refresh",
        ):
            _check_int(name, getattr(self, name))
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.k_policy == "utility" and self.utility_k_start > self.max_draft_tokens:
            raise ValueError(
                f"utility_k_start={self.utility_k_start} exceeds max_draft_tokens={self.max_draft_tokens}: "
                "lower utility_k_start or raise max_draft_tokens"
            )
        if isinstance(self.utility_tolerance, bool) or not isinstance(self.utility_tolerance, (int, float)):
            raise ValueError(f"utility_tolerance must be a number, got {self.utility_tolerance!r}")
        if not 0.0 <= self.utility_tolerance < 1.0:
            raise ValueError(f"utility_tolerance must be in [0, 1), got {self.utility_tolerance}")

    # ----------------------------------------------------------------------------------------------- conversion
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculationConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown SpeculationConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)

    @classmethod
    def coerce(cls, value: SpeculationConfig | dict[str, Any] | None) -> SpeculationConfig | None:
        """Accept a config, a dict or None (returned as is)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        raise TypeError(f"speculation must be a SpeculationConfig or a dict, got {type(value).__name__}")

    def replace(self, **changes: Any) -> SpeculationConfig:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------------------------------ files and the Hub
    def save_pretrained(
        self, save_directory: str | os.PathLike, push_to_hub: bool = False, **hub_kwargs
    ) -> str:
        """Write ``speculation_config.json`` into ``save_directory`` (created if needed); returns the file path."""
        os.makedirs(save_directory, exist_ok=True)
        path = os.path.join(save_directory, CONFIG_NAME)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")
        if push_to_hub:
            repo_id = hub_kwargs.pop("repo_id", None) or os.path.basename(os.path.abspath(save_directory))
            self.push_to_hub(repo_id, **hub_kwargs)
        return path

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, **hub_kwargs) -> SpeculationConfig:
        """Load from a folder or Hub repo holding ``speculation_config.json``, or a model folder/repo whose
        ``generation_config.json`` carries a ``speculation`` entry (see :meth:`to_generation_config`)."""
        name_or_path = str(name_or_path)
        if os.path.isdir(name_or_path):
            candidates = [
                os.path.join(name_or_path, CONFIG_NAME),
                os.path.join(name_or_path, "generation_config.json"),
            ]
            for path in candidates:
                if os.path.isfile(path):
                    loaded = _read_config_file(path)
                    if loaded is not None:
                        return loaded
            raise OSError(
                f"{name_or_path} holds neither {CONFIG_NAME} nor a generation_config.json with a 'speculation' entry"
            )
        from huggingface_hub import hf_hub_download

        errors = []
        for filename in (CONFIG_NAME, "generation_config.json"):
            try:
                path = hf_hub_download(repo_id=name_or_path, filename=filename, **hub_kwargs)
            except Exception as err:  # noqa: BLE001 - report every attempt below
                errors.append(f"{filename}: {type(err).__name__}: {err}")
                continue
            loaded = _read_config_file(path)
            if loaded is not None:
                return loaded
            errors.append(f"{filename}: no 'speculation' entry")
        raise OSError(f"could not load a SpeculationConfig from {name_or_path!r}: " + "; ".join(errors))

    def push_to_hub(
        self, repo_id: str, commit_message: str = "Upload speculation config", **hub_kwargs
    ) -> Any:
        """Upload ``speculation_config.json`` to ``repo_id`` (a model repo) through ``huggingface_hub``."""
        import tempfile

        from huggingface_hub import HfApi

        api = HfApi(token=hub_kwargs.pop("token", None))
        api.create_repo(repo_id=repo_id, exist_ok=True, private=hub_kwargs.pop("private", None))
        with tempfile.TemporaryDirectory() as tmp:
            path = self.save_pretrained(tmp)
            return api.upload_file(
                path_or_fileobj=path,
                path_in_repo=CONFIG_NAME,
                repo_id=repo_id,
                commit_message=commit_message,
                **hub_kwargs,
            )

    def to_generation_config(self, generation_config):
        """Store this config as ``generation_config.speculation`` (a plain dict, so it is saved with the model's
        ``generation_config.json``) and return the generation config."""
        generation_config.speculation = self.to_dict()
        # a generation config derived from the model config drops unknown keys when it is loaded back
        generation_config._from_model_config = False
        return generation_config


def _read_config_file(path: str) -> SpeculationConfig | None:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if os.path.basename(path) == "generation_config.json":
        data = data.get("speculation")
        if data is None:
            return None
    return SpeculationConfig.from_dict(data)


def check_model_location(name: str, value: str) -> None:
    """Raise a ValueError naming ``name`` when ``value`` can be neither a local model folder nor a Hub id.

    A folder holding ``config.json`` passes; so does anything shaped like a Hub id (``"name"`` or
    ``"org/name"``), which only loading can check. A path that is missing (``"./models/draft"``,
    ``"/data/draft"``) fails here with "folder not found" instead of transformers' "Repo id must be in the form
    ...", and so does a file or a folder without ``config.json``.

    Example:
        >>> check_model_location("draft_model", "org/tiny-draft")   # a Hub id: checked when it loads
        >>> check_model_location("draft_model", "./no/such/folder")
        Traceback (most recent call last):
        ...
        ValueError: draft_model './no/such/folder': folder not found (give an existing model folder or a Hub id like 'org/name')
    """
    if os.path.isdir(value):
        if not os.path.isfile(os.path.join(value, "config.json")):
            raise ValueError(
                f"{name} {value!r} holds no config.json: give a model folder (one written by save_pretrained)"
            )
        return
    if os.path.isfile(value):
        raise ValueError(f"{name} {value!r} is a file: give the model's folder (the one holding config.json)")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        raise ValueError(
            f"{name} {value!r}: folder not found (give an existing model folder or a Hub id like 'org/name')"
        ) from None


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
