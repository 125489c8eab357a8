"""Publish a model folder that speculates by itself: a stored SpeculationConfig plus a ``custom_generate/`` folder.

Whoever loads the folder (or the Hub repo you push it to) with ``trust_remote_code=True`` gets speculative
decoding from a bare ``model.generate(...)``; the ``custom_generate/generate.py`` it runs only calls the
installed ``hf_sparse_verify``.

    python examples/06_publish_custom_generate.py [--out FOLDER]

To share it, push the folder: ``huggingface_hub.upload_folder(repo_id="you/model", folder_path=FOLDER)``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(hsv.default_model_path(), "target"))
    parser.add_argument("--out", help="folder to write the model repo into (default: a new temporary folder)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    repo = os.path.join(args.out or tempfile.mkdtemp(prefix="hsv_example_"), "speculating-model")

    # 1. store the config in the model's generation_config.json and save model + tokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    config = hsv.SpeculationConfig(strategy="prompt_lookup", num_draft_tokens=6)
    config.to_generation_config(model.generation_config)
    model.save_pretrained(repo)
    tokenizer.save_pretrained(repo)
    # 2. add the custom_generate/ folder (generate.py + requirements.txt)
    shutil.copytree(
        os.path.join(hsv.custom_generate_path(), "custom_generate"),
        os.path.join(repo, "custom_generate"),
        dirs_exist_ok=True,
    )
    print("wrote", repo, sorted(os.listdir(repo)))

    # 3. load it back as a user would: a bare generate() call speculates with the stored config
    loaded = AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True, dtype=torch.float32).eval()
    stored = hsv.SpeculationConfig.from_pretrained(repo)  # reads the generation_config.json entry
    assert stored == config
    print(f"stored config: strategy={stored.strategy} num_draft_tokens={stored.num_draft_tokens}")
    inputs = tokenizer("def fibonacci(n):\n", return_tensors="pt")
    out = loaded.generate(
        **inputs, max_new_tokens=args.max_new_tokens, do_sample=False, return_dict_in_generate=True
    )
    print(tokenizer.decode(out.sequences[0], skip_special_tokens=True))
    print(out.speculation.summary())
    assert out.speculation.strategy == "prompt_lookup"

    plain = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    expected = plain.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    assert torch.equal(out.sequences, expected), "greedy speculative decoding must reproduce plain generate"
    print("identical to plain generate: True")


if __name__ == "__main__":
    main()
