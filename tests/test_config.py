"""`SpeculationConfig`: frozen, validated with messages that say what to change, and round trips through dicts,
files, a model's ``generation_config.json`` and the Hub (mocked)."""

from __future__ import annotations

import dataclasses
import doctest
import json

import pytest
import torch
from conftest import BOS, EOS, PAD, make_model
from transformers import AutoModelForCausalLM, GenerationConfig

import hf_sparse_verify
import hf_sparse_verify.config
from hf_sparse_verify import SpeculationConfig
from hf_sparse_verify.config import CONFIG_NAME
from hf_sparse_verify.sparse import LossySparseVerify, SparseAttention, SparseFFN

#: every field set away from its default
CUSTOM = dict(
    strategy="draft_model",
    num_draft_tokens=3,
    max_draft_tokens=9,
    k_policy="utility",
    draft_model="some-org/tiny-draft",
    draft_weights="int8",
    draft_weight_group=64,
    prompt_lookup_max_ngram=5,
    prompt_lookup_min_ngram=2,
    attention_backend="reference",
    cuda_graphs=False,
    planner_process=True,
    fused_modules=False,
    max_cache_len=4096,
    ratio=0.1,
    min_tokens=64,
    selection="all",
    vegas_scores="logits",
    vegas_lse="step",  # the default: "carried" needs vegas_scores="weights" (DEPENDENT)
    vegas_recent_share=0.25,
    vegas_pool=3,
    streaming_sinks=8,
    quest_page_size=32,
    utility_trial_steps=3,
    utility_max_trials=5,
    utility_set_steps=12,
    utility_k_start=2,
    utility_baseline_steps=6,
    utility_baseline_refresh=50,
    utility_tolerance=0.25,
    lossy_sparse_verify=LossySparseVerify(
        attention=SparseAttention(rho=0.2), ffn=SparseFFN(tau=0.1)
    ).to_dict(),
    precision="balanced",
    quality_calibration="calibration",
)


#: fields CUSTOM cannot change together with the others (vegas_lse="carried" needs vegas_scores="weights")
DEPENDENT = dict(vegas_lse="carried")


def test_custom_covers_every_field():
    defaults = SpeculationConfig()
    assert set(CUSTOM) == {f.name for f in dataclasses.fields(SpeculationConfig)}
    changed = {**{k: v for k, v in CUSTOM.items() if k not in DEPENDENT}, **DEPENDENT}
    assert all(getattr(defaults, name) != value for name, value in changed.items())
    cfg = SpeculationConfig(**{**CUSTOM, "vegas_scores": "weights", **DEPENDENT})
    assert SpeculationConfig.from_dict(cfg.to_dict()) == cfg


def test_module_docstring_example():
    result = doctest.testmod(hf_sparse_verify.config)
    assert result.attempted > 0
    assert result.failed == 0


# ---------------------------------------------------------------------------------------------------- frozen
def test_frozen():
    cfg = SpeculationConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_draft_tokens = 8
    assert cfg.num_draft_tokens == 4


def test_replace_returns_validated_copy():
    cfg = SpeculationConfig()
    changed = cfg.replace(num_draft_tokens=7)
    assert (cfg.num_draft_tokens, changed.num_draft_tokens) == (4, 7)
    with pytest.raises(ValueError, match="exceeds max_draft_tokens"):
        cfg.replace(num_draft_tokens=17)


# ------------------------------------------------------------------------------------------------ validation
BAD = [
    (
        dict(strategy="ngram"),
        r"unknown strategy 'ngram': use 'auto' or one of \[.*'draft_model'.*'prompt_lookup'.*\]",
    ),
    (
        dict(k_policy="adaptive"),
        r"unknown k_policy 'adaptive': use one of \[.*'constant'.*'heuristic'.*'utility'.*\]",
    ),
    (dict(num_draft_tokens=0), r"k_policy='constant': a constant policy needs K >= 1"),
    (dict(num_draft_tokens=-1, k_policy="heuristic"), r"num_draft_tokens must be >= 0, got -1"),
    (dict(num_draft_tokens=20), r"num_draft_tokens=20 exceeds max_draft_tokens=16: raise max_draft_tokens"),
    (dict(num_draft_tokens=5, max_draft_tokens=4), r"raise max_draft_tokens or lower num_draft_tokens"),
    (dict(max_draft_tokens=0), r"max_draft_tokens must be in \[1, 64\], got 0"),
    (dict(max_draft_tokens=65), r"max_draft_tokens must be in \[1, 64\], got 65"),
    (
        dict(prompt_lookup_min_ngram=0),
        r"need 1 <= prompt_lookup_min_ngram <= prompt_lookup_max_ngram, got 0 and 3",
    ),
    (
        dict(prompt_lookup_min_ngram=4),
        r"need 1 <= prompt_lookup_min_ngram <= prompt_lookup_max_ngram, got 4 and 3",
    ),
    (dict(prompt_lookup_max_ngram=0), r"got 1 and 0"),
    (dict(planner_process="yes"), r"planner_process must be True or False, got 'yes'"),
    (dict(num_draft_tokens=2.0), r"num_draft_tokens must be an int, got 2\.0"),
    (dict(num_draft_tokens=True), r"num_draft_tokens must be an int, got True"),
    (dict(max_draft_tokens="16"), r"max_draft_tokens must be an int, got '16'"),
    (dict(prompt_lookup_max_ngram=3.5), r"prompt_lookup_max_ngram must be an int"),
    (dict(prompt_lookup_min_ngram=None), r"prompt_lookup_min_ngram must be an int, got None"),
    (dict(max_cache_len=0), r"max_cache_len must be >= 1 or None, got 0"),
    (dict(max_cache_len=-5), r"max_cache_len must be >= 1 or None, got -5"),
    (dict(max_cache_len=1024.0), r"max_cache_len must be an int, got 1024\.0"),
    (dict(utility_trial_steps=0), r"utility_trial_steps must be >= 1, got 0"),
    (dict(utility_max_trials=0), r"utility_max_trials must be >= 1, got 0"),
    (dict(utility_set_steps=-1), r"utility_set_steps must be >= 1, got -1"),
    (dict(utility_k_start=0), r"utility_k_start must be >= 1, got 0"),
    (dict(utility_baseline_steps=0), r"utility_baseline_steps must be >= 1, got 0"),
    (dict(utility_baseline_refresh=0), r"utility_baseline_refresh must be >= 1, got 0"),
    (dict(utility_trial_steps=2.5), r"utility_trial_steps must be an int, got 2\.5"),
    (dict(k_policy="utility", utility_k_start=17), r"utility_k_start=17 exceeds max_draft_tokens=16"),
    (dict(utility_tolerance=1.0), r"utility_tolerance must be in \[0, 1\), got 1\.0"),
    (dict(ratio=0.0), r"ratio must be a number in \(0, 1\], got 0\.0"),
    (dict(ratio=1.5), r"ratio must be a number in \(0, 1\], got 1\.5"),
    (dict(min_tokens=0), r"min_tokens must be >= 1, got 0"),
    (dict(selection="first_row"), r"unknown selection 'first_row'"),
    (dict(streaming_sinks=-1), r"streaming_sinks must be >= 0, got -1"),
    (dict(vegas_pool=0), r"vegas_pool must be an odd int >= 1 \(1: no pooling\), got 0"),
    (dict(vegas_pool=4), r"vegas_pool must be an odd int >= 1 \(1: no pooling\), got 4"),
    (dict(vegas_pool=5.0), r"vegas_pool must be an int, got 5\.0"),
    (dict(quest_page_size=0), r"quest_page_size must be >= 1, got 0"),
    (dict(utility_tolerance=-0.1), r"utility_tolerance must be in \[0, 1\), got -0\.1"),
    (
        dict(attention_backend="flash"),
        r"unknown attention_backend 'flash': use one of \(.*'auto'.*'reference'.*\)",
    ),
    (
        dict(draft_model=object()),
        r"draft_model is a folder or Hub id \(str\); pass a loaded model as generate",
    ),
    (dict(draft_model=torch.nn.Linear(1, 1)), r"generate\(\.\.\., draft_model=model\)"),
]


@pytest.mark.parametrize("kwargs, message", BAD, ids=[f"{i}-{'+'.join(b[0])}" for i, b in enumerate(BAD)])
def test_invalid_field_is_rejected_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeculationConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_draft_tokens=0, k_policy="heuristic"),  # adaptive policies may start from plain decoding
        dict(num_draft_tokens=16, max_draft_tokens=16),
        dict(max_draft_tokens=64, num_draft_tokens=1),
        dict(prompt_lookup_min_ngram=2, prompt_lookup_max_ngram=2),
        dict(max_cache_len=1),
        dict(utility_tolerance=0.0),
        dict(strategy="auto", draft_model="org/draft"),  # a Hub id: checked only when it loads
    ],
)
def test_boundary_values_are_accepted(kwargs):
    cfg = SpeculationConfig(**kwargs)
    assert all(getattr(cfg, name) == value for name, value in kwargs.items())


# ------------------------------------------------------------------------------------------------ conversion
def test_dict_round_trip():
    cfg = SpeculationConfig(**CUSTOM)
    data = cfg.to_dict()
    assert data == CUSTOM
    assert json.loads(json.dumps(data)) == data  # JSON-serialisable as is
    again = SpeculationConfig.from_dict(data)
    assert again == cfg and again is not cfg


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(
        ValueError, match=r"unknown SpeculationConfig field\(s\) \['draft_tokens', 'zzz'\]; known"
    ):
        SpeculationConfig.from_dict({"draft_tokens": 3, "zzz": 1, "k_policy": "constant"})


def test_from_dict_validates_values():
    with pytest.raises(ValueError, match="unknown k_policy 'fast'"):
        SpeculationConfig.from_dict({"k_policy": "fast"})


def test_coerce():
    cfg = SpeculationConfig(num_draft_tokens=2)
    assert SpeculationConfig.coerce(cfg) is cfg
    assert SpeculationConfig.coerce(None) is None
    assert SpeculationConfig.coerce({"num_draft_tokens": 2}) == cfg
    with pytest.raises(TypeError, match="speculation must be a SpeculationConfig or a dict, got int"):
        SpeculationConfig.coerce(3)


# ------------------------------------------------------------------------------------------------------ files
def test_save_and_load_round_trip(tmp_path):
    cfg = SpeculationConfig(**CUSTOM)
    path = cfg.save_pretrained(tmp_path / "new" / "folder")
    assert path == str(tmp_path / "new" / "folder" / CONFIG_NAME)
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == CUSTOM
    assert SpeculationConfig.from_pretrained(tmp_path / "new" / "folder") == cfg
    assert SpeculationConfig.from_pretrained(str(tmp_path / "new" / "folder")) == cfg


def test_from_pretrained_reads_generation_config_of_a_model_folder(tmp_path):
    cfg = SpeculationConfig(strategy="prompt_lookup", num_draft_tokens=6, k_policy="heuristic")
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 1, "speculation": cfg.to_dict()}), encoding="utf-8"
    )
    assert SpeculationConfig.from_pretrained(tmp_path) == cfg
    # a speculation_config.json next to it wins
    own = SpeculationConfig(num_draft_tokens=2)
    own.save_pretrained(tmp_path)
    assert SpeculationConfig.from_pretrained(tmp_path) == own


def test_from_pretrained_of_a_folder_without_config_raises(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}), encoding="utf-8")
    with pytest.raises(
        OSError, match="holds neither speculation_config.json nor a generation_config.json with"
    ):
        SpeculationConfig.from_pretrained(tmp_path)


def test_to_generation_config_stores_a_plain_dict():
    generation_config = GenerationConfig(max_new_tokens=5)
    cfg = SpeculationConfig(num_draft_tokens=3)
    assert cfg.to_generation_config(generation_config) is generation_config
    assert generation_config.speculation == cfg.to_dict()
    assert json.loads(generation_config.to_json_string())["speculation"] == cfg.to_dict()


def _repetitive_prompt() -> torch.Tensor:
    # n-gram matches long enough that prompt lookup proposes K = 4 drafts at some steps of a random llama
    return torch.tensor([[5, 6, 7] * 6])


@pytest.mark.parametrize(
    "from_model_config",
    [
        False,
        True,
    ],
)
def test_generation_config_survives_model_save_and_drives_generate(tmp_path, from_model_config):
    """Store a config in the model's generation config, save and reload the model, then generate without a
    ``speculation`` argument: the stored strategy, K policy and K apply."""
    model = make_model("llama")
    if not from_model_config:
        model.generation_config = GenerationConfig(pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
    stored = SpeculationConfig(
        strategy="prompt_lookup",
        num_draft_tokens=2,
        max_draft_tokens=2,
        k_policy="heuristic",
        utility_k_start=2,
    )
    stored.to_generation_config(model.generation_config)
    model.save_pretrained(tmp_path)
    assert SpeculationConfig.from_pretrained(tmp_path) == stored

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert getattr(reloaded.generation_config, "speculation", None) == stored.to_dict()

    def run(m, **kwargs):
        return m.generate(
            input_ids=_repetitive_prompt(),
            max_new_tokens=24,
            do_sample=False,
            custom_generate=hf_sparse_verify.generate,
            return_dict_in_generate=True,
            **kwargs,
        )

    out = run(reloaded)
    assert out.speculation.strategy == "prompt_lookup"
    assert out.speculation.k_policy == "heuristic"
    assert out.speculation.draft_tokens and max(out.speculation.draft_tokens) <= 2
    # the bound is not trivially met: with the default config the same prompt drafts more than 2 tokens
    default = run(make_model("llama"), speculation=SpeculationConfig())
    assert default.speculation.k_policy == "planner"  # strategy="auto" picks K itself
    assert max(default.speculation.draft_tokens) > 2
    # and the output is the greedy continuation
    plain = reloaded.generate(input_ids=_repetitive_prompt(), max_new_tokens=24, do_sample=False)
    assert torch.equal(out.sequences, plain)


# -------------------------------------------------------------------------------------------------------- Hub
@pytest.fixture
def fake_hub(monkeypatch):
    """Record `HfApi.create_repo` / `upload_file` calls (and the uploaded file's content) instead of uploading."""
    import huggingface_hub

    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def upload_file(self, *, path_or_fileobj, path_in_repo, repo_id, **kwargs):
        with open(path_or_fileobj, encoding="utf-8") as f:
            content = f.read()
        calls.append(("upload_file", repo_id, dict(path_in_repo=path_in_repo, content=content, **kwargs)))
        return "commit-url"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_file", upload_file)
    return calls


def test_push_to_hub(fake_hub):
    cfg = SpeculationConfig(**CUSTOM)
    result = cfg.push_to_hub("me/spec-cfg", commit_message="add config", private=True)
    assert result == "commit-url"
    assert [c[0] for c in fake_hub] == ["create_repo", "upload_file"]
    _, repo_id, kwargs = fake_hub[0]
    assert repo_id == "me/spec-cfg"
    assert kwargs["exist_ok"] is True and kwargs["private"] is True
    _, repo_id, upload = fake_hub[1]
    assert repo_id == "me/spec-cfg"
    assert upload["path_in_repo"] == "speculation_config.json"
    assert upload["commit_message"] == "add config"
    assert SpeculationConfig.from_dict(json.loads(upload["content"])) == cfg


def test_save_pretrained_with_push_to_hub(tmp_path, fake_hub):
    cfg = SpeculationConfig(num_draft_tokens=5)
    cfg.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="me/other")
    assert SpeculationConfig.from_pretrained(tmp_path / "local") == cfg
    uploads = [c for c in fake_hub if c[0] == "upload_file"]
    assert len(uploads) == 1 and uploads[0][1] == "me/other"
    assert SpeculationConfig.from_dict(json.loads(uploads[0][2]["content"])) == cfg


def test_from_pretrained_hub_falls_back_to_generation_config(tmp_path, monkeypatch):
    import huggingface_hub

    cfg = SpeculationConfig(num_draft_tokens=3, k_policy="heuristic")
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"speculation": cfg.to_dict()}), encoding="utf-8"
    )
    requested = []

    def hf_hub_download(repo_id, filename, **kwargs):
        requested.append((repo_id, filename))
        if filename == CONFIG_NAME:
            raise FileNotFoundError(filename)
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    assert SpeculationConfig.from_pretrained("org/model") == cfg
    assert requested == [("org/model", CONFIG_NAME), ("org/model", "generation_config.json")]


def test_from_pretrained_hub_reports_every_attempt(monkeypatch):
    import huggingface_hub

    def hf_hub_download(repo_id, filename, **kwargs):
        raise FileNotFoundError(f"no {filename}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    with pytest.raises(
        OSError,
        match=r"could not load a SpeculationConfig from 'org/none'.*speculation_config\.json.*"
        r"generation_config\.json",
    ):
        SpeculationConfig.from_pretrained("org/none")


def test_precision_classes():
    """``exact`` never runs anything lossy; a hand-set lossy setting has no calibrated class, so only ``fast`` runs
    it; the class follows from what is asked for unless named."""
    lossy = {"attention": {"rho": 0.1}}
    assert SpeculationConfig().precision == "exact"
    fast = SpeculationConfig(lossy_sparse_verify=lossy)
    assert fast.precision == "fast"
    assert SpeculationConfig.from_dict(fast.to_dict()) == fast
    with pytest.raises(ValueError, match="precision='exact' never runs anything lossy"):
        SpeculationConfig(precision="exact", lossy_sparse_verify=lossy)
    for gated in ("near_exact", "balanced"):
        with pytest.raises(ValueError, match="has no class: name the calibration that graded it"):
            SpeculationConfig(precision=gated, lossy_sparse_verify=lossy)
        assert SpeculationConfig(precision=gated).lossy_sparse_verify is None  # admitted, not imposed
    with pytest.raises(ValueError, match="precision must be one of"):
        SpeculationConfig(precision="lossy")
