"""The ``auto`` planner's cost profiles: kept per model, drafter set and shape bucket for the process, and saved
beside a model (``speculation_profile.json``, as the sparse-verification calibration is), so a published model
carries its measured step costs and its first call plans from them.

A profile entry holds measured step parts (`CostProfile`) of one (drafters, batch, prompt-length bucket, dtype,
device). A saved file is read from the model's folder (``model.name_or_path``) or its Hub repository the first time a
call of a shape finds no profile in the process; only entries of the same device name, dtype, drafters and shape are
used, so another GPU or shape measures afresh. Later calls keep refining the in-process profile; save it again with
`save_profile`.

Example:
    >>> import hf_sparse_verify as hsv
    >>> # after some calls with strategy="auto":
    >>> # hsv.save_profile(model, "my-model")   # writes my-model/speculation_profile.json
"""

from __future__ import annotations

import json
import os
import weakref
from collections import OrderedDict

import torch

from .policies.planner import CostProfile

PROFILE_FILE = "speculation_profile.json"
#: profiles kept in the process, least recently used first out
MAX_PROFILES = 64
#: in-process key -> (file key, profile, weak reference to the model); the in-process key holds the model's identity
#: (whose ``id`` a model loaded after it is freed can take over: the reference tells them apart), the file key what
#: travels
_PROFILES: OrderedDict[tuple, tuple[dict, CostProfile, weakref.ref]] = OrderedDict()


def device_name(model) -> str:
    device = model.get_input_embeddings().weight.device
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def file_key(model, members: list[str], batch: int, prompt_len: int) -> dict:
    """What a saved entry must match to be used: drafters, batch, prompt-length bucket, dtype and device."""
    return {
        "members": list(members),
        "batch": int(batch),
        "length_bucket": int(prompt_len).bit_length(),
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": device_name(model),
    }


def profile_for(model, process_key: tuple, members: list[str], batch: int, prompt_len: int) -> CostProfile:
    """The process's profile for ``process_key``; on a miss, the matching entry of the model's saved file, else a
    new one."""
    found = _PROFILES.get(process_key)
    if found is not None and found[2]() is model:
        _PROFILES.move_to_end(process_key)
        return found[1]
    wanted = file_key(model, members, batch, prompt_len)
    profile = _saved(model, wanted) or CostProfile()
    _PROFILES[process_key] = (wanted, profile, weakref.ref(model))
    while len(_PROFILES) > MAX_PROFILES:
        _PROFILES.popitem(last=False)
    return profile


def measured_profiles(model=None) -> list[dict]:
    """The profiles this process keeps (of ``model`` only, when given): each its file key (drafters, batch,
    prompt-length bucket, dtype, device) and ``"profile"``, its measurements (`CostProfile.to_dict`)."""
    return [
        {**key, "profile": profile.to_dict()}
        for key, profile, owner in _PROFILES.values()
        if model is None or owner() is model
    ]


def save_profile(model, directory: str | os.PathLike) -> str:
    """Write the process's profiles of ``model`` (every shape and drafter set its ``auto`` calls measured) to
    ``directory/speculation_profile.json``, keeping the file's entries for other devices, dtypes or shapes. Returns
    the path."""
    fresh = measured_profiles(model)
    if not fresh:
        raise ValueError(
            "no auto profile of this model in this process: run generate with strategy='auto' on it first"
        )
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, PROFILE_FILE)
    entries = _read(path) if os.path.isfile(path) else []
    kept = [e for e in entries if not any(_matches(e, f) for f in fresh)]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"format": 1, "entries": kept + fresh}, f, indent=1)
        f.write("\n")
    return path


def _matches(entry: dict, key: dict) -> bool:
    return all(entry.get(name) == value for name, value in key.items() if name != "profile")


def _saved(model, wanted: dict) -> CostProfile | None:
    location = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", "")
    if not location:
        return None
    path = os.path.join(location, PROFILE_FILE)
    if not os.path.isfile(path):
        if os.path.isdir(location) or os.path.isabs(location):
            return None
        try:  # a Hub id: the file is optional, and a machine offline simply measures afresh
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(repo_id=location, filename=PROFILE_FILE)
        except Exception:  # noqa: BLE001 - any failure to fetch an optional file means: no saved profile
            return None
    for entry in _read(path):
        if _matches(entry, wanted):
            return CostProfile.from_dict(entry["profile"])
    return None


def _read(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("format") != 1 or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path} is not a speculation profile (format 1): delete it or save it again")
    return data["entries"]
