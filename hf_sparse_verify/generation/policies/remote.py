"""The planner in a process of its own, beside the decoding loop.

On small and medium models a step is host-bound: the device waits on the Python that launches the next step, so
every host second the planner spends lengthens the call (one H100, bench_e2e run22: a renewal of one drafter's
estimates took about 0.7 ms of host time against 0.5-3 ms steps, and `auto` ran 0.77-0.93x the best single
strategy at 1 x 4K to 4 x 16K, at 1 x 4K with the very same choices). `RemotePlanner` moves the planning to a child
process on another core: the loop sends each step's outcome (a few hundred bytes through a socket) and takes the
newest choice the child has made, without waiting for it; the child takes the outcomes in and plans as fast as they
come, with no share of the steps to keep to.

The choices are the `Planner`'s, made on the same evidence; they lag the outcomes by about one step, as the in-loop
planner's do (it plans while the device verifies), and a step that finds no newer choice repeats the last one.
Every choice is lossless, so the output does not depend on the timing. The choices do depend on it, which is why
tensor-parallel ranks (which must agree on every choice) keep the in-loop planner.

The child imports only this folder's plain modules (numpy and the standard library, no torch): it starts once per
process (its first choice came about 0.1 s after the start on this project's CPU) and ends when the parent closes
its socket.
"""

from __future__ import annotations

import math
import os
import pickle
import socket
import subprocess
import sys
import threading
from array import array
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple

from .k_policy import KPolicy, StepOutcome
from .planner import CostProfile, Member, Planner

#: how the child imports this folder without the package (whose ``__init__`` imports torch and transformers)
_CHILD = (
    "import sys, types; from multiprocessing.connection import Connection; "
    "package = types.ModuleType('_hsv_policies'); package.__path__ = [sys.argv[1]]; "
    "sys.modules['_hsv_policies'] = package; "
    "from _hsv_policies import remote; remote.serve(Connection(int(sys.argv[2])))"
)
#: seconds to wait for the child's first choice of a call (it answers within a few ms) or for its profile
_ANSWER_S = 30.0


class _Scored(NamedTuple):
    """A scored proposal as `Planner` reads it (``utility_policy.Step``'s fields, without importing it)."""

    issued: int
    accepted: tuple


def _encode(outcome: StepOutcome, codes: dict) -> bytes:
    """What `Planner` reads of an outcome, as one array of int64 and one of float64 (a pickled outcome cost
    110-140 us per step on this project's CPU, cold after the step's device work). ``codes``: drafter name -> int.

    ints: index, K, K issued, drafter (-1: plain), rows R, then per row accepted (-1: finished), active,
    remaining (-1: not given), then the scored proposals: count, and per proposal drafter, row, issued, accepted;
    floats: time, draft, verify, update seconds (NaN where unknown)."""
    extra = outcome.extra
    member = extra.get("member")
    rows = extra.get("rows")
    if rows is None:
        rows = list(outcome.accepted)
    count = len(rows)
    active = extra.get("active", [True] * count)
    remaining = extra.get("remaining", [-1] * count)
    ints = [
        outcome.index,
        outcome.k,
        extra.get("issued", outcome.k),
        -1 if member is None else codes[member],
        count,
    ]
    ints += [-1 if a is None else a for a in rows]
    ints += [int(a) for a in active]
    ints += remaining
    shadow = [(codes[n], row, step.issued, step.accepted[0]) for n, steps in extra.get("shadow", {}).items()
              for row, step in steps]  # fmt: skip
    ints.append(len(shadow))
    for entry in shadow:
        ints += entry
    nan = float("nan")
    parts = extra.get("parts") or (nan, nan, nan)
    floats = [nan if outcome.time_s is None else outcome.time_s, *parts]
    head = array("q", [len(ints)]).tobytes()
    return head + array("q", ints).tobytes() + array("d", floats).tobytes()


def _decode(data: bytes, names: list) -> StepOutcome:
    """The `StepOutcome` `_encode` wrote (``names``: drafter code -> name)."""
    (length,) = array("q", data[:8])
    ints = array("q", data[8 : 8 + 8 * length]).tolist()
    floats = array("d", data[8 + 8 * length :]).tolist()
    index, k, issued, member, count = ints[:5]
    rows = [None if a < 0 else a for a in ints[5 : 5 + count]]
    active = [bool(a) for a in ints[5 + count : 5 + 2 * count]]
    remaining = ints[5 + 2 * count : 5 + 3 * count]
    at = 5 + 3 * count
    shadow: dict = {}
    for i in range(ints[at]):
        code, row, s_issued, s_accepted = ints[at + 1 + 4 * i : at + 5 + 4 * i]
        shadow.setdefault(names[code], []).append((row, _Scored(s_issued, (s_accepted,))))
    time_s, *parts = floats
    extra = {
        "member": None if member < 0 else names[member],
        "issued": issued,
        "rows": rows,
        "active": active,
        "shadow": shadow,
        "parts": None if math.isnan(parts[0]) else tuple(parts),
    }
    if remaining and remaining[0] >= 0:
        extra["remaining"] = remaining
    accepted = [a for a in rows if a is not None]
    return StepOutcome(index, k, accepted, None if math.isnan(time_s) else time_s, extra=extra)


def _pickled(message) -> bytes:
    return b"p" + pickle.dumps(message)


def serve(conn: Connection) -> None:
    """The child's loop: one `Planner` per call, a choice sent after each burst of outcomes, the planner's reports
    with the profile at the end; every answer carries its call's number, so that a call that ended early (an
    exception in the loop) cannot answer the next."""
    planner, call, names, codes, reports = None, 0, [], {}, []

    def choose() -> None:
        member, k = planner.next_step(planner.most_remaining())  # as of the outcomes taken in
        reports.append(planner.state())
        conn.send_bytes(b"c" + array("q", [call, -1 if member is None else codes[member], k]).tobytes())

    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            if data[:1] == b"o":
                planner.observe(_decode(data[1:], names))
                if not conn.poll():  # caught up: plan the next step (outcomes that came together, once)
                    planner.prepare()
                    choose()
                continue
            message = pickle.loads(data[1:])
            if message[0] == "start":
                _, call, members, max_k, batch, profile_state = message
                names = list(members)
                codes = {name: i for i, name in enumerate(names)}
                reports = []
                profile = CostProfile.__new__(CostProfile)
                profile.__dict__.update(profile_state)
                planner = Planner({n: Member(*m) for n, m in members.items()}, max_k, batch, profile)
            elif message[0] == "begin":
                planner.begin(message[1])
                choose()
            elif message[0] == "finish":
                planner.finish()
                conn.send_bytes(_pickled(("profile", call, planner.profile.__dict__, reports)))
                planner = None
        except Exception:  # noqa: BLE001 - the parent raises it with the child's traceback
            import traceback

            conn.send_bytes(_pickled(("error", call, traceback.format_exc())))
            planner = None


class _Server:
    """The child process and its socket; one per process, used by one call at a time."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        folder = str(Path(__file__).resolve().parent)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, folder, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def alive(self) -> bool:
        """The child runs, and it is this process's (a forked process starts its own)."""
        return self.pid == os.getpid() and self.proc.poll() is None


_SERVER: _Server | None = None
_SERVER_LOCK = threading.Lock()


def server() -> _Server | None:
    """The process's planner child, started at the first call that asks (None where it cannot start)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or not _SERVER.alive():
            try:
                _SERVER = _Server()
            except OSError:
                _SERVER = None
        return _SERVER


class RemotePlanner(KPolicy):
    """`Planner`'s choices, made in the planner child (see the module docstring). Built by `remote_planner`, which
    holds the child for this call; `finish` (or, after an exception, garbage collection) lets it go."""

    needs_timing = True
    plans_drafters = True
    _calls = 0

    def __init__(
        self, srv: _Server, members: dict[str, Member], max_k: int, batch: int, profile: CostProfile
    ):
        super().__init__(0, max_k)
        RemotePlanner._calls += 1
        self._call = RemotePlanner._calls
        self._server = srv
        self._conn = srv.conn
        self.profile = profile
        self._names = list(members)
        self._codes = {name: i for i, name in enumerate(self._names)}
        self._choice: tuple[str | None, int] = (None, 0)
        self._reports: list[dict] = []
        self._started = False
        members_state = {n: (m.start_k, m.draft_grows_with_k, m.warm_share) for n, m in members.items()}
        self._conn.send_bytes(_pickled(("start", self._call, members_state, max_k, batch, profile.__dict__)))
        self._held = True  # the lock `remote_planner` took: released by `finish`

    @property
    def k_bound(self) -> int:
        return self.max_k

    def begin(self, prefill_s: float | None) -> None:
        self._conn.send_bytes(_pickled(("begin", prefill_s)))

    def _answer(self, block: bool, until: bytes = b"c") -> None:
        """Takes every message the child has sent for this call (when ``block``, until one of kind ``until``:
        ``b"c"`` a choice, ``b"p"`` the profile); keeps the newest choice."""
        waiting = block
        while waiting or self._conn.poll():
            if waiting and not self._conn.poll(_ANSWER_S):
                raise RuntimeError(
                    f"hf_sparse_verify: the planner process did not answer in {_ANSWER_S:.0f} s"
                )
            try:
                data = self._conn.recv_bytes()
            except (EOFError, OSError) as error:
                raise RuntimeError(
                    "hf_sparse_verify: the planner process ended during the call; the next call starts a new one "
                    "(or set SpeculationConfig(planner_process=False) to plan in the loop)"
                ) from error
            kind = data[:1]
            if kind == b"c":
                call, member, k = array("q", data[1:]).tolist()
                if call != self._call:
                    continue  # an earlier call's late answer
                self._choice = (None if member < 0 else self._names[member], k)
            else:
                name, call, *body = pickle.loads(data[1:])
                if call != self._call:
                    continue
                if name == "error":
                    raise RuntimeError(f"hf_sparse_verify: the planner process failed:\n{body[0]}")
                self.profile.__dict__.update(body[0])  # "profile"
                self._reports = body[1]
            waiting = waiting and kind != until

    def next_k(self) -> int:
        return self.next_step(self.max_k + 1)[1]

    def next_step(self, remaining: int) -> tuple[str | None, int]:
        self._answer(block=not self._started)  # the call's first choice is waited for, later ones never
        self._started = True
        return self._choice

    def observe(self, outcome: StepOutcome) -> None:
        self._conn.send_bytes(b"o" + _encode(outcome, self._codes))

    def finish(self) -> None:
        """Ends the call in the child and takes back the profile it measured (kept for the next call) and its
        reports."""
        try:
            self._conn.send_bytes(_pickled(("finish",)))
            self._answer(block=True, until=b"p")
        finally:
            self._release()

    def late_reports(self) -> list[dict]:
        """The child's reports, one per choice it made (`Planner.state`), handed over by `finish`."""
        return self._reports

    def _release(self) -> None:
        if getattr(self, "_held", False):
            self._held = False
            self._server.lock.release()

    def __del__(self) -> None:  # a call that raised before `finish`: the child is free for the next call
        self._release()


def remote_planner(
    members: dict[str, Member], max_k: int, batch: int, profile: CostProfile
) -> KPolicy | None:
    """A `RemotePlanner` on the process's planner child, or None where it cannot run now (it could not start, or
    another call holds it): the caller then plans in the loop."""
    srv = server()
    if srv is None or not srv.lock.acquire(blocking=False):
        return None
    try:
        return RemotePlanner(srv, members, max_k, batch, profile)
    except OSError:
        srv.lock.release()
        return None
