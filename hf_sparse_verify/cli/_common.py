"""What every subcommand shares: one-line usage errors (exit status 2), argument types, prompt files, devices and
model locations checked before anything loads."""

from __future__ import annotations

import argparse
import json
import os
import socket

from ..config import SpeculationConfig, check_model_location

DTYPES = ("float32", "bfloat16", "float16")


class UsageError(Exception):
    """A mistake in the command line; `main` prints it as one line and exits with status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (``prog: error: ...; see prog --help``) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -------------------------------------------------------------------------------------------- argument types
def positive_int(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def probability(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,2,4, got {text!r}"
        ) from None


def table(title: str, rows: dict[str, str]) -> str:
    width = max(map(len, rows)) + 2
    return f"{title}:\n" + "".join(f"  {name:<{width}}{meaning}\n" for name, meaning in rows.items())


def read_prompt_file(path: str, flag: str = "--prompt-file") -> list[str]:
    """Prompts of a text file (the whole file is one prompt) or a ``.jsonl`` file (``{"text": ...}`` per line).

    Every problem raises a `UsageError` naming the file, the line and what to change.

    Example:
        >>> import os, tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        ...     _ = f.write('{"text": "def f():"}\\n\\n{"text": "import os"}\\n')
        >>> read_prompt_file(f.name)
        ['def f():', 'import os']
        >>> os.remove(f.name)
    """
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path!r}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path!r} is a folder: give a text file or a .jsonl file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {path!r} is not UTF-8 text: give a text file or a .jsonl file") from None
    if not path.endswith(".jsonl"):
        if not text.strip():
            raise UsageError(f"{flag} {path!r} is empty: write the prompt into it")
        return [text]
    prompts = []
    example = '{"text": "your prompt"}'
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{flag} {path!r} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(
                f"{where}: not valid JSON ({err.msg}); write one object per line like {example}"
            ) from None
        if not isinstance(row, dict) or "text" not in row:
            raise UsageError(f'{where} has no "text" field: write one object per line like {example}')
        if not isinstance(row["text"], str) or not row["text"]:
            raise UsageError(f'{where}: "text" must be a non-empty string, got {row["text"]!r}')
        prompts.append(row["text"])
    if not prompts:
        raise UsageError(f"{flag} {path!r} holds no prompts: write one object per line like {example}")
    return prompts


def device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a device: use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device {name}: this torch ({torch.__version__}) sees no CUDA GPU; use --device cpu, or install a "
            "CUDA build of torch on a GPU machine"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    return name


def check_model(flag: str, path: str | None) -> None:
    """A local model folder, or a Hub id that is cached or reachable: anything else is one line now, not a
    traceback after transformers' download retries (28-53 s without a network)."""
    if path is None:
        return
    try:
        check_model_location(flag, path)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if os.path.isdir(path) or _cached_on_hub(path):
        return
    why = _hub_unreachable()
    if why is not None:
        raise UsageError(
            f"{flag} {path!r} is not a local folder, is not in the Hugging Face cache, and the Hub cannot be "
            f"reached ({why}): give a model folder, or run where the Hub is reachable"
        )


def _cached_on_hub(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hub cannot be reached (offline mode, or no connection within ``timeout_s``), or None. Behind a
    proxy the probe is left to the download itself."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    host = constants.ENDPOINT.split("://", 1)[-1].split("/", 1)[0]
    name, _, port = host.partition(":")
    try:
        socket.create_connection((name, int(port or 443)), timeout=timeout_s).close()
    except OSError as err:
        return f"no connection to {host}: {one_line(err)}"
    return None


def check_output(flag: str, path: str | None) -> None:
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(
            f"{flag} {path!r}: the folder {folder!r} does not exist; create it or pick another path"
        )


def config(**fields) -> SpeculationConfig:
    try:
        return SpeculationConfig(**fields)
    except ValueError as err:
        raise UsageError(str(err)) from None


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def load(what: str, path: str, loader):
    """``loader(path)``; a failure to load (no such Hub repo, no network, not a model folder) is a usage error."""
    try:
        return loader(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"{what} {path!r} could not be loaded: {one_line(err)}") from err


def load_model(flag: str, path: str, dtype: str, device_name: str):
    """``(tokenizer, model)`` of ``path`` in ``dtype`` on ``device_name``, in eval mode; failures are usage errors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def model_of(p):
        return AutoModelForCausalLM.from_pretrained(p, dtype=getattr(torch, dtype)).to(device_name).eval()

    return load(flag, path, AutoTokenizer.from_pretrained), load(flag, path, model_of)


def default_dtype(dtype: str | None, device_name: str) -> str:
    return dtype or ("float32" if device_name == "cpu" else "bfloat16")


def demo_model(name: str) -> str:
    """A model of the embedded demo pair (``target`` or ``draft``)."""
    from .. import default_model_path

    return os.path.join(default_model_path(), name)


def tuning_prompts(args) -> list:
    """The ``--prompt-file`` prompts of ``tune`` and ``calibrate`` (``--prompt-len``, ``--max-prompts``); format
    errors as one line, before anything loads."""
    from ..drivers.tune import read_prompts

    read_prompt_file(args.prompt_file)
    try:
        return read_prompts(args.prompt_file, args.prompt_len, args.max_prompts)
    except ValueError as err:
        raise UsageError(one_line(err)) from None
