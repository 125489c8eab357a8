"""How close a low-bit copy's next-token distribution stays to the model's, per way of picking the scales
(``LowBitLinear(rounding=...)``: ``"absmax"`` or ``"mse"``, `hf_sparse_verify.kernels.low_bit.naive.quantize`), on
the trained code-target fixture, teacher-forced over held-out windows, float32 (machine-independent: it measures
weights, not speed).

Per format and rounding: the rounded layers' squared error relative to their weights (mean over layers), the mean KL
of the model's next-token distribution to the copy's, and the copy's top-1 agreement with the model. Acceptance, the
measure the issue gates on, is `bench_low_bit_acceptance.py` (``--rounding``); this is its cheap proxy.

    python benchmarks/bench_low_bit_rounding.py --windows 6 --length 2048

Writes the record ``<device>:<group_size>`` of ``benchmarks/results/low_bit_rounding.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _records  # noqa: E402
from hf_sparse_verify.generation.drafters.low_bit import low_bit_copy, low_bit_linears  # noqa: E402
from hf_sparse_verify.integrations.low_bit_linear import LowBitLinear, LowBitRows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@torch.no_grad()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--windows", type=int, default=6, help="held-out windows (prompts.jsonl, 2K ones first)"
    )
    parser.add_argument("--length", type=int, default=2048, help="tokens per window")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    _records.add_arguments(parser, "low_bit_rounding")
    args = parser.parse_args(argv)
    models = Path(args.shared) / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "code-target")
    model = AutoModelForCausalLM.from_pretrained(models / "code-target", dtype=torch.float32)
    model = model.to(args.device).eval()
    rows = [json.loads(line) for line in (models / "prompts.jsonl").read_text().splitlines() if line.strip()]
    texts = [r["text"] for r in rows if r["len"] >= args.length][: args.windows]
    windows = [tokenizer(t, return_tensors="pt").input_ids[:, : args.length].to(args.device) for t in texts]
    reference = [model(input_ids=w).logits[0].log_softmax(-1) for w in windows]
    originals = {name: m.weight for name, m in low_bit_linears(model)}
    results = []
    for fmt, rounding in tqdm(
        [(f, r) for f in ("int8", "int4") for r in ("absmax", "mse")], desc="roundings"
    ):
        copy = low_bit_copy(model, fmt, args.group_size, rounding=rounding)
        layers = {
            n: m
            for n, m in copy.named_modules()
            if isinstance(m, (LowBitLinear, LowBitRows)) and not n.endswith(".whole")
        }
        relative = [
            float(
                (m.dequantized() - originals[n].float()).square().sum() / originals[n].float().square().sum()
            )
            for n, m in layers.items()
        ]
        kl = agree = positions = 0.0
        for window, ref in zip(windows, reference):
            logp = copy(input_ids=window).logits[0].log_softmax(-1)
            kl += float((ref.exp() * (ref - logp)).sum())
            agree += float((logp.argmax(-1) == ref.argmax(-1)).sum())
            positions += ref.shape[0]
        results.append(
            dict(
                weights=fmt,
                rounding=rounding,
                relative_weight_error=sum(relative) / len(relative),
                kl=kl / positions,
                top1=agree / positions,
                positions=int(positions),
            )
        )
        print(results[-1], flush=True)
    record = dict(
        model="code-target", dtype="float32", group_size=args.group_size, windows=len(windows),
        length=args.length, rows=results,
    )  # fmt: skip
    device_name = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else "cpu"
    _records.save(args, record, args.device, setting=f"{device_name}:{args.group_size}")


if __name__ == "__main__":
    main()
