"""Verifiable rewards for RL (GRPO): the verifiers AI2's open-instruct ran for OLMo 3, and a safe call.

A verifier is a function `verify(response, ground_truth, **options) -> float` with a score in [0, 1].
`verifier(name)` finds one: the built-ins below, under the names open-instruct gives them (its
`VerifierFunction.name`, which is what a row's `dataset` column names in its RL data; looked up lowercased,
as open-instruct's `build_all_verifiers` keys them), then the Python entry points of the group
`olmax.verifiers` (a package declares `[project.entry-points."olmax.verifiers"] my_task =
"my_pkg.rewards:verify"`).

`score(name, response, ground_truth, timeout=...)` is the call the RL loop makes: it returns
`(score, status)` and never raises for a verifier's fault. status is "ok"; "timeout" (the verifier ran
past `timeout`, or past what its module's `time_bound` says it may need when that is more: `call_bound`;
or a program under test ran past its limit); "error" (it raised, or its process died);
"invalid" (it returned something that is not a finite number in [0, 1]). All but "ok" score 0. With a
timeout the verifier runs in a worker process (spawned once, kept, and replaced after a timeout or a
crash: sympy can hang on adversarial LaTeX, and a hung thread cannot be stopped); `timeout=None` runs it
in the caller's process (no bound on time, for tests and trusted verifiers).

The reward the RL loop adds is `scale * score`, scale being grpo.reward_scale (open-instruct's
`--verification_reward`, 10.0 by default in `open_instruct/grpo_fast.py` at 42aa63c and 9ade62d, which the
OLMo 3 scripts leave there; olmax.config.grpo keeps that default). `reward(datasets, ground_truths,
response, scale=...)` is that sum over a row's (verifier, ground truth) pairs (`total`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import multiprocessing
import numbers
import threading
from collections.abc import Callable

# not `import math`: importing the submodule olmax.rewards.math rebinds this package's `math` name
from math import isfinite

from olmax.errors import ConfigError

ENTRY_POINT_GROUP = "olmax.verifiers"

# name -> "module:function"; imported on first use, so that asking for `code` never imports sympy
BUILTINS = {
    "math": "olmax.rewards.math:verify",
    "ifeval": "olmax.rewards.ifeval:verify",
    "code": "olmax.rewards.code:verify",
    "code_stdio": "olmax.rewards.code:verify_stdio",
}

OK, TIMEOUT, ERROR, INVALID = "ok", "timeout", "error", "invalid"
STATUSES = (OK, TIMEOUT, ERROR, INVALID)
WARM_SECONDS = 120.0  # the bound on loading a verifier in a fresh worker (imports), apart from the call's
CALL_MARGIN_S = 5.0  # the worker's own part of a call on top of a verifier's time_bound: pipes, pickling

Verifier = Callable[..., float]


class UnknownVerifier(ConfigError):
    """A verifier name that is neither built in nor an `olmax.verifiers` entry point."""


def _entry_points() -> dict:
    return {ep.name.lower(): ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def known() -> list[str]:
    """Every name `verifier` finds: the built-ins and the installed entry points."""
    return sorted(set(BUILTINS) | set(_entry_points()))


def _load(target: str) -> Verifier:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def verifier(name: str) -> Verifier:
    """The verify function called `name` (case-insensitive); a built-in wins over an entry point of the
    same name. UnknownVerifier names every known one."""
    key = name.lower()
    if key in BUILTINS:
        return _load(BUILTINS[key])
    eps = _entry_points()
    if key in eps:
        return eps[key].load()
    raise UnknownVerifier(
        f"unknown verifier {name!r}; known: {', '.join(known())} (add one with an {ENTRY_POINT_GROUP!r} entry point)"
    )


def check_score(value) -> float | None:
    """`value` as a float when it is a finite real number in [0, 1], else None."""
    if isinstance(value, str | bytes) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if isfinite(value) and 0.0 <= value <= 1.0 else None


def call(fn: Verifier | str, response: str, ground_truth, options: dict | None = None) -> tuple[float, str]:
    """Run a verifier here, in this process: (score, status) with the statuses of `score`, except that a
    hang is not bounded."""
    try:
        fn = verifier(fn) if isinstance(fn, str) else fn
        value = fn(response, ground_truth, **(options or {}))
    except Exception as e:
        return 0.0, TIMEOUT if isinstance(e, TimeoutError) else ERROR
    checked = check_score(value)
    return (0.0, INVALID) if checked is None else (checked, OK)


def warm(fn: Verifier | str) -> None:
    """Pay a verifier's start-up here: its module's imports, and its `warm()` when it has one (math parses
    once, building the LaTeX parser's tables; ifeval imports lm-eval's checkers, ~3 s)."""
    fn = verifier(fn) if isinstance(fn, str) else fn
    module = importlib.import_module(getattr(fn, "__module__", None) or __name__)
    if callable(getattr(module, "warm", None)):
        module.warm()


def _serve(conn) -> None:
    # the worker: one request at a time, until the pipe closes; ("warm", target) loads a verifier
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request[0] == "warm":
            try:
                warm(request[1])
                conn.send((1.0, OK))
            except Exception:
                conn.send((0.0, ERROR))
            continue
        conn.send(call(*request[1:]))


class _Worker:
    """One spawned process that runs verifiers (spawn, not fork: the caller may hold JAX's threads).

    Each verifier is warmed in a fresh worker before its first call, under WARM_SECONDS, so that a call's
    own timeout measures the verification, not the imports (lm-eval's IFEval checkers import in ~3 s: with
    a 2 s timeout every call would otherwise kill the worker before it finished loading)."""

    def __init__(self):
        self.process = None
        self.conn = None
        self.warmed = set()
        self.lock = threading.Lock()

    def _start(self):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True, name="olmax-verifier")
        self.process.start()
        child.close()

    def stop(self):
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.conn.close()
        self.process = self.conn = None
        self.warmed = set()

    def _ask(self, request, timeout: float) -> tuple[float, str]:
        try:
            self.conn.send(request)
            if not self.conn.poll(timeout):
                self.stop()  # the only way to stop a hung verifier
                return 0.0, TIMEOUT
            return self.conn.recv()
        except (EOFError, OSError):
            # the worker died mid-call (a crash in C code, os._exit, the OOM killer)
            self.stop()
            return 0.0, ERROR
        except Exception:
            # the request or the reply did not pickle
            self.stop()
            return 0.0, ERROR

    def run(self, target, args: tuple, timeout: float) -> tuple[float, str]:
        with self.lock:
            if self.process is None or not self.process.is_alive():
                self.stop()
                self._start()
            key = target if isinstance(target, str) else id(target)
            if key not in self.warmed:
                result = self._ask(("warm", target), WARM_SECONDS)
                if result[1] != OK:
                    return 0.0, result[1] if result[1] == TIMEOUT else ERROR
                self.warmed.add(key)
            return self._ask(("call", target, *args), timeout)


_worker = _Worker()


def score(
    name: str | Verifier, response: str, ground_truth, timeout: float | None = 30.0, options: dict | None = None
) -> tuple[float, str]:
    """(score in [0, 1], status) of `response` against `ground_truth` by the verifier `name` (a name
    `verifier` finds, or a picklable verify function); see the module docstring for the statuses. An
    unknown name raises UnknownVerifier (a configuration error, not a verifier's fault). `options` are
    the verifier's keyword arguments (e.g. `{"seconds": 2.0}` for code). Calls from several threads share
    the one worker, one at a time."""
    if isinstance(name, str):
        verifier(name)  # an unknown name fails here, loudly
    if timeout is None:
        return call(name, response, ground_truth, options)
    return _worker.run(name, (response, ground_truth, options), call_bound(name, ground_truth, timeout, options))


def call_bound(name: str | Verifier, ground_truth, timeout: float, options: dict | None = None) -> float:
    """The seconds `score` gives one call: `timeout`, or more when the verifier's module says the call
    may need more (its `time_bound(ground_truth, **options)`), plus CALL_MARGIN_S. The code verifier's
    sandbox bounds each test by itself (6 s by default) and so needs about (6 + 1.25) x tests + 12 s at
    most (olmax.rewards.code.time_bound): a fixed bound below that scores a correct program with many
    tests 0 as a timeout. (open-instruct
    bounded its code API's HTTP call at max(30, min(300, 10 x code_max_execution_time)), 60 s in the
    OLMo 3 scripts whatever the number of tests: `CodeVerifier.async_call`, ground_truth_utils.py at
    42aa63c and 9ade62d; here the sandbox's own bounds decide.) A ground truth the verifier cannot read
    gets `timeout`: the call reports its error."""
    fn = verifier(name) if isinstance(name, str) else name
    need = getattr(importlib.import_module(getattr(fn, "__module__", None) or __name__), "time_bound", None)
    if need is None:
        return timeout
    try:
        return max(timeout, need(ground_truth, **(options or {})) + CALL_MARGIN_S)
    except Exception:
        return timeout


def total(parts: list[tuple[str, float, str]], scale: float) -> float:
    """A row's reward from its (name, score, status) pairs: `scale` x the sum of the scores (every
    built-in's weight is 1, as open-instruct's)."""
    return scale * sum(value for _, value, _ in parts)


def reward(
    datasets: str | list[str],
    ground_truths,
    response: str,
    timeout: float | None = 30.0,
    options: dict[str, dict] | None = None,
    *,
    scale: float,
) -> tuple[float, list[tuple[str, float, str]]]:
    """One response's reward from its row, as open-instruct's `apply_verifiable_reward`
    (`open_instruct/model_utils.py`, 42aa63c): a row's `dataset` and `ground_truth` are a string each or
    two lists of one length (the Dolci-*-RL sets store lists), paired item by item; the reward is
    `total`: scale (grpo.reward_scale) x the sum of the pairs' scores. Returns (reward,
    [(name, score, status) per pair]). `options` maps a verifier name to its keyword arguments. Unlike
    upstream, which logs and skips a pair whose verifier it does not know, an unknown name raises."""
    names = [datasets] if isinstance(datasets, str) else list(datasets)
    truths = [ground_truths] if isinstance(ground_truths, str) else list(ground_truths)
    if len(names) != len(truths):
        raise ValueError(f"{len(names)} verifier names but {len(truths)} ground truths")
    for name in names:
        verifier(name)  # every name known before any verifier runs
    parts = []
    for name, truth in zip(names, truths):
        value, status = score(name, response, truth, timeout, (options or {}).get(name.lower()))
        parts.append((name, value, status))
    return total(parts, scale), parts


def shutdown() -> None:
    """Stop the worker process (it is a daemon, so exiting stops it too)."""
    with _worker.lock:
        _worker.stop()
