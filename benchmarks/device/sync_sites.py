"""Where a strategy's host synchronisations come from: the Python stack of every one in a warm call (device only).

    python benchmarks/device/sync_sites.py plain prompt_lookup --new-tokens 40

Runs the toy Llama of ``tests/test_spine_gpu.py`` (same prompts and settings), one warm-up call, then a call under
``torch.cuda.set_sync_debug_mode("warn")`` with every warning's stack printed, grouped by stack, most frequent
first.
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from conftest import ragged_batch  # noqa: E402
from test_spine_gpu import STRATEGIES, _run  # noqa: E402

from hf_sparse_verify.drivers.syncs import watch_syncs  # noqa: E402


def stacks_of(fn) -> collections.Counter:
    """How often each stack (its innermost 7 frames: who called what synchronised) synchronised in ``fn()``."""
    seen: collections.Counter = collections.Counter()
    watch_syncs(fn, lambda stack: seen.update(["".join(traceback.format_list(stack[-7:]))]))
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="+", choices=list(STRATEGIES))
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--short", type=int, default=12, help="a shorter call: stacks whose counts differ")
    args = parser.parse_args()
    ids, mask = (t.cuda() for t in ragged_batch(3, 40))
    for name in args.names:
        _run(name, ids, mask, 8)
        seen = stacks_of(lambda name=name: _run(name, ids, mask, args.new_tokens))
        out = _run(name, ids, mask, args.new_tokens)
        short = stacks_of(lambda name=name: _run(name, ids, mask, args.short))
        out_short = _run(name, ids, mask, args.short)
        print(f"=== {name}: {sum(seen.values())} syncs, {out.speculation.steps} steps")
        for stack, count in seen.most_common():
            print(f"--- {count}x\n{stack}")
        print(
            f"=== {name}, {args.short} tokens: {sum(short.values())} syncs, {out_short.speculation.steps} steps"
        )
        for stack in set(seen) | set(short):
            if seen[stack] != short[stack]:
                print(f"--- {seen[stack]}x long, {short[stack]}x short\n{stack}")


if __name__ == "__main__":
    main()
