"""The instruction-following verifier: the fraction of a prompt's IFEval constraints the answer satisfies.

What AI2 ran for OLMo 3's RL (allenai/open-instruct `open_instruct/ground_truth_utils.py`, class
`IFEvalVerifier` and `remove_thinking_section`, identical at 42aa63c (Think RL) and 9ade62d (Instruct
RL)), re-written here:

- the answer is the response with the thinking removed: `<|assistant|>` dropped, everything up to the last
  `</think>` dropped, `<answer>`/`</answer>` tags dropped, whitespace stripped;
- an empty response or an empty answer scores 0;
- each constraint is built with its kwargs (those whose value is None left out) and checked on the
  answer; the score is the number satisfied over the number of constraints.

The checkers are lm-eval 0.4.13's (`lm_eval.tasks.ifeval.instructions_registry`, the `eval` extra) for
the 25 constraints of Google's IFEval: open-instruct checks with its own copy, `open_instruct/IFEvalG`,
whose 25 shared checkers build and check as lm-eval's do (compared by AST at 42aa63c). The 29 that
IFEvalG added for RL data (`count:`, `copy:`, `first_word:`, ...) are `olmax.rewards.ifeval_extra`. An
id in neither raises `UnknownConstraint` (the safe `score` counts it as "error"), so that a reward is
never silently computed from part of the constraints.

The ground truth, as open-instruct stores it in the `ground_truth` column: a string holding a Python
literal list whose first item is a dict (or a JSON string of one) with `instruction_id` (a list of ids)
and `kwargs` (a list of dicts or None, one per id), e.g.
`"[{'instruction_id': ['punctuation:no_comma'], 'kwargs': [None]}]"`. The parsed list or dict is
accepted too.
"""

from __future__ import annotations

import ast
import json

from olmax.extras import require
from olmax.rewards import ifeval_extra

NAME = "ifeval"


class UnknownConstraint(KeyError):
    """A constraint id that lm-eval's IFEval registry does not hold."""


def registry() -> dict:
    """lm-eval's instruction id -> checker class (MissingExtra naming the `eval` extra when absent)."""
    module = require("lm_eval.tasks.ifeval.instructions_registry", "the ifeval reward")
    return module.INSTRUCTION_DICT


def warm() -> None:
    """Import lm-eval's checkers (~3 s: lm-eval's task package and NLTK)."""
    registry()


def remove_thinking(response: str) -> str:
    """The answer part of a response (open-instruct's `remove_thinking_section`)."""
    answer = response.replace("<|assistant|>", "").strip().split("</think>")[-1]
    return answer.replace("<answer>", "").replace("</answer>", "").strip()


def parse_ground_truth(ground_truth) -> tuple[list[str], list[dict]]:
    """(instruction ids, kwargs dicts with the None values left out) of a ground truth (module docstring)."""
    spec = ground_truth
    if isinstance(spec, str):
        spec = ast.literal_eval(spec)
    if isinstance(spec, list | tuple):
        spec = spec[0]
    if isinstance(spec, str):
        spec = json.loads(spec)
    ids = list(spec["instruction_id"])
    kwargs = list(spec.get("kwargs") or [None] * len(ids))
    if len(kwargs) != len(ids):
        raise ValueError(f"{len(ids)} instruction ids but {len(kwargs)} kwargs")
    return ids, [{k: v for k, v in (kw or {}).items() if v is not None} for kw in kwargs]


def check(answer: str, instruction_id: str, kwargs: dict) -> bool:
    """Whether `answer` satisfies one constraint: by lm-eval's checker, else by IFEvalG's additions."""
    checkers = registry()
    if instruction_id not in checkers:
        if instruction_id in ifeval_extra.CHECKS:
            return bool(ifeval_extra.CHECKS[instruction_id](answer, **kwargs))
        known = sorted(checkers) + sorted(ifeval_extra.CHECKS)
        raise UnknownConstraint(f"unknown IFEval constraint {instruction_id!r}; known: {', '.join(known)}")
    checker = checkers[instruction_id](instruction_id)
    checker.build_description(**kwargs)
    return bool(checker.check_following(answer))


def verify(response: str, ground_truth) -> float:
    """The fraction of the ground truth's constraints that the response's answer satisfies."""
    ids, kwargs = parse_ground_truth(ground_truth)
    answer = remove_thinking(response)
    if not ids or not response.strip() or not answer:
        # upstream returns 0 for an empty response before checking anything (and would divide by zero
        # on an empty constraint list)
        return 0.0
    return sum(check(answer, i, kw) for i, kw in zip(ids, kwargs)) / len(ids)
