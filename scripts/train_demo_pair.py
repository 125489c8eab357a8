#!/usr/bin/env python3
"""Train the embedded demo pair (target + draft + one tokenizer) of hf_sparse_verify.

The pair is a pair of *tiny* Llama models trained for a few minutes on Python
source code, so that ``hf-sparse-verify generate`` has something to run
offline. They are demo models: their quality says nothing about real LLMs.

Steps:
 1. corpus: every ``*.py`` file under ``site.getsitepackages()`` (deduplicated
    by content hash, files > 200 KB skipped). Packages sympy, networkx, seaborn
    and statsmodels are held out (held-out loss / agreement only). The training
    part is capped at ``--max-corpus-mb`` (files are shuffled first, so the cap
    takes a random sample across packages).
 2. tokenizer: byte-level BPE, vocab 4096, ``<|endoftext|>`` = id 0 (eos, bos
    and pad), saved as a transformers fast tokenizer.
 3. two ``LlamaForCausalLM`` models (target, draft) trained on random windows
    with AdamW, warmup + cosine, bf16 autocast on CUDA, grad clip 1.0, each for
    a wall-clock budget or ``--max-steps``, whichever comes first.
 4. both saved in bfloat16 safetensors, each folder with the tokenizer and a
    generation_config.json, so each loads alone.
 5. held-out loss of both, teacher-forced greedy agreement of draft vs target,
    and ``training_report.json``.

CPU smoke test::

    python scripts/train_demo_pair.py --output /tmp/demo --device cpu --max-steps 3 \
        --max-corpus-mb 5 --seq-len 128 --batch-size 4
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import platform
import random
import shlex
import site
import sys
import time
from pathlib import Path

HELDOUT_PACKAGES = ("sympy", "networkx", "seaborn", "statsmodels")
EOS = "<|endoftext|>"
VOCAB_SIZE = 4096
MAX_FILE_BYTES = 200 * 1024

MODEL_SPECS = {
    "target": dict(
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=512,
    ),
    "draft": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
    ),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- corpus
def top_package(rel: Path) -> str:
    """Top-level import name of a file relative to a site-packages dir."""
    first = rel.parts[0]
    if len(rel.parts) == 1:  # a top-level module, e.g. six.py
        return first[:-3] if first.endswith(".py") else first
    return first


def collect_corpus(max_train_bytes: int, max_heldout_bytes: int, seed: int):
    roots = []
    for d in site.getsitepackages():
        p = Path(d)
        if p.is_dir() and p.resolve() not in [r.resolve() for r in roots]:
            roots.append(p)
    log(f"site-packages dirs: {[str(r) for r in roots]}")
    train_paths, heldout_paths = [], []
    skipped_big = 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                path = Path(dirpath) / fn
                try:
                    if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                        skipped_big += path.is_file()
                        continue
                except OSError:
                    continue
                pkg = top_package(path.relative_to(root))
                (heldout_paths if pkg in HELDOUT_PACKAGES else train_paths).append(path)
    rng = random.Random(seed)
    rng.shuffle(train_paths)
    rng.shuffle(heldout_paths)

    seen: set[bytes] = set()
    stats = dict(
        candidate_train_files=len(train_paths),
        candidate_heldout_files=len(heldout_paths),
        skipped_over_200kb=skipped_big,
        duplicates=0,
        undecodable=0,
    )

    def take(paths, cap):
        texts, nbytes = [], 0
        for path in paths:
            if nbytes >= cap:
                break
            try:
                raw = path.read_bytes()
            except OSError:
                continue
            if not raw.strip():
                continue
            h = hashlib.sha256(raw).digest()
            if h in seen:
                stats["duplicates"] += 1
                continue
            seen.add(h)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                stats["undecodable"] += 1
                continue
            texts.append(text)
            nbytes += len(raw)
        return texts, nbytes

    # held-out first, so a file duplicated inside a held-out package never lands in training
    heldout, heldout_bytes = take(heldout_paths, max_heldout_bytes)
    train, train_bytes = take(train_paths, max_train_bytes)
    stats.update(
        train_files=len(train),
        train_bytes=train_bytes,
        heldout_files=len(heldout),
        heldout_bytes=heldout_bytes,
        heldout_packages=list(HELDOUT_PACKAGES),
        site_packages=[str(r) for r in roots],
    )
    return train, heldout, stats


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts, sample_bytes: int, seed: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    rng = random.Random(seed + 1)
    order = list(range(len(texts)))
    rng.shuffle(order)
    sample, n = [], 0
    for i in order:
        if n >= sample_bytes:
            break
        sample.append(texts[i])
        n += len(texts[i])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t0 = time.time()
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    assert tok.token_to_id(EOS) == 0, "<|endoftext|> must be id 0"
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    log(f"tokenizer trained on {len(sample)} files / {n / 1e6:.1f} MB chars in {time.time() - t0:.1f}s")

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        bos_token=EOS,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out_dir)

    # round-trip check through AutoTokenizer
    loaded = AutoTokenizer.from_pretrained(out_dir)
    probe = [
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        'class Foo(Bar):\n\t"""Docstring with unicode: héllo ✓ 日本"""\n    x = {\'a\': [1, 2.5e-3]}  # comment\n',
        texts[order[0]][:2000],
    ]
    for p in probe:
        ids = loaded(p, add_special_tokens=True)["input_ids"]
        back = loaded.decode(ids)
        assert back == p, f"tokenizer round-trip failed:\n{p!r}\n{back!r}"
        assert ids == tok.encode(p).ids
    assert loaded.eos_token_id == 0 and loaded.pad_token_id == 0 and loaded.bos_token_id == 0
    log(f"tokenizer round-trip OK through AutoTokenizer ({type(loaded).__name__})")
    return tok


def encode_corpus(tok, texts, chunk: int = 4096):
    import numpy as np

    enc_fn = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    parts = []
    for i in range(0, len(texts), chunk):
        for enc in enc_fn(texts[i : i + chunk], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.int32))
            parts.append(np.zeros(1, dtype=np.int32))  # <|endoftext|> separator (id 0)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


# --------------------------------------------------------------------------- models
def make_config(name: str):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attention_bias=False,
        mlp_bias=False,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        initializer_range=0.02,
        use_cache=True,
        **MODEL_SPECS[name],
    )


def sample_batch(tokens, batch: int, seq: int, gen):
    import torch

    hi = tokens.numel() - seq - 1
    starts = torch.randint(0, hi, (batch,), device=tokens.device, generator=gen)
    idx = starts[:, None] + torch.arange(seq + 1, device=tokens.device)[None, :]
    w = tokens[idx].long()
    return w[:, :-1], w[:, 1:]


def lr_factor(step: int, progress: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warmup over `warmup` steps, then cosine from 1 to `final_frac` over `progress` in [0, 1]."""
    if step < warmup:
        return (step + 1) / warmup
    p = min(max(progress, 0.0), 1.0)
    return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * p))


def train_model(name, train_tokens, args, device, lr, minutes, hard_stop=None):
    """Train one model for `minutes` of wall-clock (the first step, which includes compilation, is not
    counted) or `args.max_steps` steps, whichever first; never past the absolute time `hard_stop`."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed + (0 if name == "target" else 1))
    cfg = make_config(name)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[{name}] {n_params / 1e6:.3f}M params (tied embeddings), config: {MODEL_SPECS[name]}")

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt_kwargs = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        **opt_kwargs,
    )

    use_amp = device.type == "cuda"

    def loss_fn(x, y):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
            logits = model(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))

    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 17 + (0 if name == "target" else 1))

    def one_step(fn, step, progress):
        f = lr_factor(step, progress, args.warmup_steps)
        for g in opt.param_groups:
            g["lr"] = lr * f
        x, y = sample_batch(train_tokens, args.batch_size, args.seq_len, gen)
        loss = fn(x, y)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, gnorm

    budget_s = minutes * 60.0
    t_first = time.time()

    # compile: used only if the first real step works; the choice is printed either way
    compile_mode = "eager"
    fn = loss_fn
    compile_s = 0.0
    if (args.compile == "auto" and device.type == "cuda") or args.compile == "on":
        try:
            cfn = torch.compile(loss_fn, dynamic=False)
            tc = time.time()
            loss, gnorm = one_step(cfn, 0, 0.0)
            float(loss)
            compile_s = time.time() - tc
            fn, compile_mode = cfn, "torch.compile"
            log(
                f"[{name}] using torch.compile (first step incl. compilation: {compile_s:.1f}s, loss {float(loss):.3f})"
            )
            first_done = True
        except Exception as e:  # noqa: BLE001
            log(f"[{name}] torch.compile FAILED ({type(e).__name__}: {str(e)[:300]}); USING EAGER MODE")
            opt.zero_grad(set_to_none=True)
            first_done = False
    else:
        first_done = False
    if compile_mode == "eager":
        log(f"[{name}] using eager mode (no torch.compile)")

    step = 1 if first_done else 0
    t_start = time.time()  # budget starts after the (compiling) first step
    if hard_stop is not None and t_start + budget_s > hard_stop:
        new_budget = max(hard_stop - t_start, 1.0)
        log(f"[{name}] budget cut from {budget_s:.0f}s to {new_budget:.0f}s by --deadline-minutes")
        budget_s = new_budget
    tokens_per_step = args.batch_size * args.seq_len
    losses = []  # (step, loss)
    ema = None
    loss_acc = [loss.detach()] if first_done else []
    t_loop = time.time()
    last_print = t_loop
    while True:
        elapsed = time.time() - t_start
        if elapsed >= budget_s or (args.max_steps and step >= args.max_steps):
            break
        progress = elapsed / budget_s
        if args.max_steps:
            progress = max(progress, step / args.max_steps)
        loss, gnorm = one_step(fn, step, progress)
        loss_acc.append(loss.detach())
        step += 1
        if (
            step % args.log_every == 0
            or (args.max_steps and step >= args.max_steps)
            or time.time() - last_print > 15
        ):
            vals = torch.stack(loss_acc).float().cpu().tolist()
            loss_acc = []
            for v in vals:
                ema = v if ema is None else 0.98 * ema + 0.02 * v
            losses.append((step, vals[-1]))
            now = time.time()
            tok_s = (step - (1 if first_done else 0)) * tokens_per_step / max(now - t_loop, 1e-9)
            log(
                f"[{name}] step {step:6d} loss {vals[-1]:.4f} (ema {ema:.4f}) gnorm {float(gnorm):.2f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {tok_s / 1e6:.2f}M tok/s elapsed {now - t_start:.0f}s"
                f"/{budget_s:.0f}s"
            )
            last_print = now
    if loss_acc:
        vals = torch.stack(loss_acc).float().cpu().tolist()
        for v in vals:
            ema = v if ema is None else 0.98 * ema + 0.02 * v
        losses.append((step, vals[-1]))
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.time() - t_start
    info = dict(
        params=n_params,
        steps=step,
        tokens_seen=step * tokens_per_step,
        train_wall_s=round(wall, 1),
        train_wall_incl_first_step_s=round(time.time() - t_first, 1),
        budget_s=round(budget_s, 1),
        compile=compile_mode,
        first_step_s=round(compile_s, 1),
        lr=lr,
        final_train_loss_ema=round(ema, 4) if ema is not None else None,
        tokens_per_s=round((step - (1 if first_done else 0)) * tokens_per_step / max(wall, 1e-9)),
        loss_curve=[(s, round(v, 4)) for s, v in losses[:: max(1, len(losses) // 40)]],
    )
    log(
        f"[{name}] done: {step} steps, {info['tokens_seen'] / 1e6:.1f}M tokens, {wall:.1f}s, mode {compile_mode}"
    )
    model.eval()
    return model, info


# --------------------------------------------------------------------------- evaluation
def fixed_windows(tokens, n: int, seq: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    hi = tokens.numel() - seq - 1
    if hi <= 0:
        raise ValueError(f"too few tokens ({tokens.numel()}) for windows of {seq}")
    starts = torch.randint(0, hi, (n,), generator=g)
    idx = starts[:, None] + torch.arange(seq + 1)[None, :]
    return tokens.cpu()[idx].long()


def evaluate(models: dict, windows, device, batch: int):
    """Loss (nats/token) and top-1 accuracy per model; teacher-forced argmax agreement draft vs target."""
    import torch
    import torch.nn.functional as F

    tot = {k: 0.0 for k in models}
    correct = {k: 0 for k in models}
    agree, n = 0, 0
    with torch.no_grad():
        for i in range(0, windows.size(0), batch):
            w = windows[i : i + batch].to(device)
            x, y = w[:, :-1], w[:, 1:]
            preds = {}
            for k, m in models.items():
                logits = m(input_ids=x, use_cache=False).logits.float()
                tot[k] += F.cross_entropy(
                    logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum"
                ).item()
                preds[k] = logits.argmax(-1)
                correct[k] += (preds[k] == y).sum().item()
            if "target" in preds and "draft" in preds:
                agree += (preds["target"] == preds["draft"]).sum().item()
            n += y.numel()
    out = {k: dict(loss=round(tot[k] / n, 4), top1_acc=round(correct[k] / n, 4)) for k in models}
    out["greedy_agreement_draft_vs_target"] = round(agree / n, 4)
    out["eval_tokens"] = n
    return out


# --------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", required=True, help="output dir (gets target/, draft/, training_report.json)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-corpus-mb", type=float, default=300.0, help="cap on training corpus bytes")
    ap.add_argument("--max-heldout-mb", type=float, default=20.0, help="cap on held-out corpus bytes")
    ap.add_argument(
        "--tokenizer-train-mb",
        type=float,
        default=64.0,
        help="sample of the training corpus the BPE tokenizer is trained on",
    )
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--target-minutes", type=float, default=3.0)
    ap.add_argument("--draft-minutes", type=float, default=1.5)
    ap.add_argument(
        "--max-steps", type=int, default=0, help="stop each model after this many steps (0: no cap)"
    )
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument("--draft-lr", type=float, default=4e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto: try torch.compile on CUDA (prints whether it was used)",
    )
    ap.add_argument(
        "--deadline-minutes",
        type=float,
        default=0.0,
        help="if > 0: hard cap on the whole script's wall-clock; the training budgets are cut so "
        "that saving and evaluation still fit (0: no cap)",
    )
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=200)
    args = ap.parse_args(argv)

    t_all = time.time()
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "_tokenizer"
    device_name = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    )
    log(
        f"device {device} ({device_name}), torch {torch.__version__}, transformers {transformers.__version__}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs"
    )

    # 1. corpus
    t0 = time.time()
    train_texts, heldout_texts, cstats = collect_corpus(
        int(args.max_corpus_mb * 1e6), int(args.max_heldout_mb * 1e6), args.seed
    )
    log(
        f"corpus: {cstats['train_files']} train files / {cstats['train_bytes'] / 1e6:.1f} MB, "
        f"{cstats['heldout_files']} held-out files / {cstats['heldout_bytes'] / 1e6:.1f} MB "
        f"({cstats['duplicates']} duplicates, {cstats['skipped_over_200kb']} files > 200 KB skipped) "
        f"in {time.time() - t0:.1f}s"
    )
    if not heldout_texts:
        raise SystemExit(
            f"none of the held-out packages {HELDOUT_PACKAGES} is installed; cannot measure held-out loss"
        )
    collect_s = time.time() - t0

    # 2. tokenizer
    t0 = time.time()
    tok = train_tokenizer(train_texts, int(args.tokenizer_train_mb * 1e6), args.seed, tok_dir)
    tok_train_s = time.time() - t0
    t0 = time.time()
    train_ids = encode_corpus(tok, train_texts)
    heldout_ids = encode_corpus(tok, heldout_texts)
    encode_s = time.time() - t0
    bpt_train = cstats["train_bytes"] / max(len(train_ids), 1)
    bpt_heldout = cstats["heldout_bytes"] / max(len(heldout_ids), 1)
    log(
        f"encoded: {len(train_ids) / 1e6:.2f}M train tokens ({bpt_train:.2f} bytes/token), "
        f"{len(heldout_ids) / 1e6:.2f}M held-out tokens ({bpt_heldout:.2f} bytes/token) in {encode_s:.1f}s"
    )
    del train_texts, heldout_texts
    train_tokens = torch.from_numpy(train_ids).to(device)
    heldout_tokens = torch.from_numpy(heldout_ids)

    # 3. train
    results = {}
    models = {}
    deadline = t_all + args.deadline_minutes * 60 if args.deadline_minutes > 0 else None
    reserve_end_s = 60.0  # saving, reloading, evaluation, sampling
    reserve_draft_s = args.draft_minutes * 60 + 60.0  # draft training + its compilation
    for name, lr, minutes in (
        ("target", args.target_lr, args.target_minutes),
        ("draft", args.draft_lr, args.draft_minutes),
    ):
        hard_stop = None
        if deadline is not None:
            hard_stop = deadline - reserve_end_s - (reserve_draft_s if name == "target" else 0.0)
        m, info = train_model(name, train_tokens, args, device, lr, minutes, hard_stop)
        models[name] = m
        results[name] = info

    # 4. save (bf16, each folder self-contained)
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (AutoTokenizer below)

    hf_tok = AutoTokenizer.from_pretrained(tok_dir)
    save_kwargs = {}
    if "safe_serialization" in inspect.signature(models["target"].save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # newer transformers always write safetensors
    for name, m in models.items():
        m.to(torch.bfloat16)
        m.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=0)
        d = out / name
        m.save_pretrained(d, **save_kwargs)
        hf_tok.save_pretrained(d)
        assert (d / "model.safetensors").is_file(), f"no model.safetensors in {d}"
        log(
            f"saved {name} -> {d} ({sum(f.stat().st_size for f in d.iterdir()) / 1e6:.2f} MB): "
            f"{sorted(f.name for f in d.iterdir())}"
        )

    # reload from disk (what users get) and evaluate the bf16 weights
    loaded = {}
    for name in models:
        lt = AutoTokenizer.from_pretrained(out / name)
        assert lt.eos_token_id == 0 and lt.pad_token_id == 0
        lm = AutoModelForCausalLM.from_pretrained(out / name, dtype=torch.bfloat16).to(device).eval()
        loaded[name] = lm
    del models

    # 5. evaluate
    t0 = time.time()
    eval_seq = args.seq_len
    hw = fixed_windows(heldout_tokens, args.eval_windows, eval_seq, args.seed + 99)
    tw = fixed_windows(train_tokens.cpu(), args.eval_windows, eval_seq, args.seed + 98)
    eval_bs = 16 if device.type == "cuda" else 4
    held = evaluate(loaded, hw, device, eval_bs)
    trn = evaluate(loaded, tw, device, eval_bs)
    eval_s = time.time() - t0
    log(
        f"held-out: target loss {held['target']['loss']:.4f}, draft loss {held['draft']['loss']:.4f}, "
        f"greedy agreement {held['greedy_agreement_draft_vs_target']:.4f} ({held['eval_tokens']} tokens)"
    )
    log(
        f"train windows: target loss {trn['target']['loss']:.4f}, draft loss {trn['draft']['loss']:.4f}, "
        f"agreement {trn['greedy_agreement_draft_vs_target']:.4f}"
    )

    # quick greedy sample (sanity)
    prompt = "def fibonacci(n):\n"
    enc = hf_tok(prompt, return_tensors="pt").to(device)
    samples = {}
    with torch.no_grad():
        for name, lm in loaded.items():
            g = lm.generate(**enc, max_new_tokens=40, do_sample=False)
            samples[name] = hf_tok.decode(g[0])
            log(f"[{name}] greedy sample: {samples[name]!r}")

    sizes = {name: {f.name: f.stat().st_size for f in sorted((out / name).iterdir())} for name in loaded}
    report = dict(
        description="hf_sparse_verify embedded demo pair: tiny Llama target + draft trained on Python source. "
        "Demo models only, not a proxy for real LLMs.",
        command=" ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        args=vars(args),
        device=str(device),
        device_name=device_name,
        cpu_count=os.cpu_count(),
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        tokenizers_version=__import__("tokenizers").__version__,
        python_version=platform.python_version(),
        corpus=dict(
            **cstats,
            train_tokens=int(len(train_ids)),
            heldout_tokens=int(len(heldout_ids)),
            bytes_per_token_train=round(bpt_train, 3),
            bytes_per_token_heldout=round(bpt_heldout, 3),
        ),
        tokenizer=dict(
            type="byte-level BPE",
            vocab_size=VOCAB_SIZE,
            special_tokens={EOS: 0},
            eos_bos_pad_id=0,
            trained_on_mb=args.tokenizer_train_mb,
        ),
        models={name: dict(config=MODEL_SPECS[name], **results[name]) for name in results},
        eval=dict(
            window_len=eval_seq,
            windows=args.eval_windows,
            heldout=held,
            train=trn,
            note="loss in nats/token of the saved bf16 weights; agreement = fraction of positions where "
            "draft and target argmax agree under teacher forcing on the same windows",
        ),
        greedy_samples=samples,
        files_bytes=sizes,
        timings_s=dict(
            collect=round(collect_s, 1),
            tokenizer_train=round(tok_train_s, 1),
            encode=round(encode_s, 1),
            eval=round(eval_s, 1),
            total=round(time.time() - t_all, 1),
        ),
    )
    report["wall_time_s"] = report["timings_s"]["total"]
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    import shutil

    shutil.rmtree(tok_dir, ignore_errors=True)
    log(f"wrote {out / 'training_report.json'}; total {report['wall_time_s']:.1f}s")


if __name__ == "__main__":
    main()
