"""Precision classes granted by a quality calibration (issue 40): ``hf-sparse-verify calibrate --grade`` writes each
candidate lossy setting's measured class into the calibration's ``grades``; ``precision="near_exact"`` /
``"balanced"`` with ``quality_calibration`` runs the first setting a class it admits was granted, else exact."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

import hf_sparse_verify as hsv
from hf_sparse_verify.generation.engine import loop
from hf_sparse_verify.sparse import LossySparseVerify, SparseAttention
from hf_sparse_verify.sparse.calibration import SparseCalibration


def _setting(rho: float) -> dict:
    return LossySparseVerify(attention=SparseAttention(block_size=16, rho=rho, dense_below=32)).to_dict()


def _calibration(classes: list[str], layers: int = 2) -> SparseCalibration:
    grades = [
        {"name": f"rho {rho}", "setting": {k: v for k, v in _setting(rho).items() if k != "calibration"},
         "class": cls, "why_not_higher": "", "measures": {}}
        for rho, cls in zip((0.1, 0.3, 0.5), classes)
    ]  # fmt: skip
    return SparseCalibration(model_type="llama", num_layers=layers, grades=grades)


def test_granted_takes_the_first_setting_of_an_admitted_class(tmp_path):
    calibration = _calibration(["fast", "balanced", "near_exact"])
    calibration.save(tmp_path)
    loaded = SparseCalibration.load(tmp_path)
    assert loaded.grades == calibration.grades
    assert loaded.granted("near_exact").attention.rho == 0.5
    balanced = loaded.granted("balanced", str(tmp_path))
    assert balanced.attention.rho == 0.3 and balanced.calibration == str(tmp_path)
    assert _calibration(["fast", "fast", "balanced"]).granted("near_exact") is None
    with pytest.raises(ValueError, match="near_exact"):
        loaded.granted("fast")


def test_quality_calibration_needs_a_gated_precision():
    with pytest.raises(ValueError, match="quality_calibration"):
        hsv.SpeculationConfig(quality_calibration="calibration")  # precision exact
    with pytest.raises(ValueError, match="quality_calibration"):
        hsv.SpeculationConfig(precision="near_exact", lossy_sparse_verify={"attention": {"rho": 0.2}})
    hsv.SpeculationConfig(precision="balanced", quality_calibration="calibration")


def _run(model, speculation, monkeypatch=None):
    settings = []
    if monkeypatch is not None:
        state = loop.SparseVerifyState

        def spy(setting, *args):
            settings.append(setting)
            return state(setting, *args)

        monkeypatch.setattr(loop, "SparseVerifyState", spy)
    torch.manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (1, 120))
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
        custom_generate=hsv.generate, speculation=speculation,
    )  # fmt: skip
    return out, settings


def test_generate_runs_the_granted_setting_else_exact(tmp_path, monkeypatch):
    model = make_model("llama")
    layers = model.config.num_hidden_layers
    plain, _ = _run(model, {"strategy": "prompt_lookup", "num_draft_tokens": 4})
    # nothing granted near_exact: the call stays exact
    _calibration(["fast", "balanced"], layers).save(tmp_path / "none")
    speculation = {"strategy": "prompt_lookup", "num_draft_tokens": 4, "precision": "near_exact",
                   "quality_calibration": str(tmp_path / "none")}  # fmt: skip
    out, ran = _run(model, speculation, monkeypatch)
    assert torch.equal(out, plain) and ran == []
    # balanced admits the second grade (rho 0.3): that setting runs, as a hand-set precision='fast' one would
    speculation["precision"] = "balanced"
    out, ran = _run(model, speculation, monkeypatch)
    assert len(ran) == 1 and ran[0].attention.rho == 0.3
    fast, _ = _run(model, {"strategy": "prompt_lookup", "num_draft_tokens": 4, "precision": "fast",
                           "lossy_sparse_verify": _setting(0.3)})  # fmt: skip
    assert torch.equal(out, fast)
    # a hand-set setting with quality_calibration must be one the calibration graded that class
    speculation["lossy_sparse_verify"] = _setting(0.5)
    with pytest.raises(ValueError, match="grades"):
        _run(model, speculation)


def test_calibration_for_another_depth_is_refused(tmp_path):
    model = make_model("llama")
    _calibration(["near_exact"], layers=model.config.num_hidden_layers + 1).save(tmp_path)
    with pytest.raises(ValueError, match="layers"):
        _run(model, {"strategy": "prompt_lookup", "precision": "near_exact", "quality_calibration": str(tmp_path)})
