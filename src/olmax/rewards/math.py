"""The math verifier: 1.0 when an answer extracted from the response equals the ground truth, else 0.0.

What AI2 ran for OLMo 3's RL (allenai/open-instruct `open_instruct/ground_truth_utils.py`, class
`MathVerifier`, identical at 42aa63c (Think RL) and 9ade62d (Instruct RL); its helpers are in
`open_instruct/math_utils.py` at the same commits). Re-written here, not copied:

1. Candidates, in this order: the content of the last `\\boxed{...}` (or `\\boxed X`, or `\\fbox{...}`);
   the Minerva answer ("Final Answer: The final answer is X. I hope it is correct.", normalised); only if
   neither exists, the text between the last two `$`; only if none of those, the whole response
   (normalised, and raw).
2. A candidate is right when sympy says `candidate - truth` simplifies to 0 (both parsed by sympy's
   LaTeX parser, which needs the antlr4 runtime 4.11 that sympy 1.14 requires and open-instruct pins),
   or when the two strings are equal after the Hendrycks MATH normalisation (`_strip`).

The boxed candidate is compared as written (open-instruct does not normalise it before comparing); the
other candidates go through Minerva's normalisation (Lewkowycz et al. 2022, appendix D).

Upstream bounds each sympy comparison with a 5 s SIGALRM; here that alarm is used only in the main thread
(signals cannot be set elsewhere), and `olmax.rewards.verifiers.score` bounds the whole call in any case.
"""

from __future__ import annotations

import re
import signal
import threading
from math import isfinite

NAME = "math"

# Minerva's textual clean-up (appendix D of Lewkowycz et al. 2022, as open-instruct applies it): first
# these replacements, in order ...
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# ... then these words and macros are deleted (units and filler that make equal answers differ as text)
_REMOVED = (
    "square ways integers dollars mph inches ft hours km units \\ldots sue points feet minutes digits cents "
    "degrees cm gm pounds meters meals edges students childrentickets multiples"
).split() + [
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
]

_MINERVA = re.compile(r"Final Answer: The final answer is(.*?). I hope it is correct.")
INVALID = "[invalidanswer]"
SYMPY_SECONDS = 5  # upstream's per-comparison alarm


def last_boxed(text: str) -> str | None:
    """The last `\\boxed{...}` (braces balanced) with its macro, or None. Upstream quirks kept on purpose,
    since they decide the reward: `\\boxed X` (a space, no brace) wins over any braced box and runs to the
    next `$`; `\\fbox{...}` counts only when there is no `\\boxed` at all."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def unbox(boxed: str) -> str | None:
    """The content of `last_boxed`'s result; None for an `\\fbox{}` (upstream's assertion fails on it,
    and it drops the candidate)."""
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{") : -1]
    return None


def minerva_answer(text: str) -> str:
    """X of "Final Answer: The final answer is X. I hope it is correct." (the closing sentence may be
    missing: it is appended first, as upstream does), else INVALID."""
    m = _MINERVA.search(text + "I hope it is correct.")
    return m.group(1).strip() if m else INVALID


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation: the right-hand side of the last `=`, units and filler removed, the content
    of `$..$`, `\\text{}`, `\\textbf{}`, `\\overline{}` and `\\boxed{}` kept, shorthand `\\fracab` and
    `\\sqrta` braced, thousands separators dropped from a plain integer."""
    answer = answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for word in _REMOVED:
        answer = answer.replace(word, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer


def candidates(response: str) -> list[str]:
    """The answers open-instruct's MathVerifier tries, in its order (see the module docstring)."""
    found = []
    boxed = last_boxed(response)
    if boxed is not None and (content := unbox(boxed)) is not None:
        found.append(content)
    minerva = normalize_final_answer(minerva_answer(response))
    if minerva != INVALID:
        found.append(minerva)
    if not found:
        dollars = [m.start() for m in re.finditer(r"\$", response)]
        if len(dollars) > 1:
            found.append(normalize_final_answer(response[dollars[-2] + 1 : dollars[-1]]))
    if not found:
        found += [normalize_final_answer(response), response]
    return found


# --- Hendrycks MATH string normalisation (open-instruct's `strip_string` and helpers) -----------------


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{72} -> \frac{1}{72}; a \frac with under two characters after it
    # leaves the whole string as it was
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if part[0] == "{":  # an empty remainder raises, as upstream's indexing does
            out += part
            continue
        if len(part) < 2:
            return s
        a, b, tail = part[0], part[1], part[2:]
        out += "{" + a + "}" + (b if b == "{" else "{" + b + "}") + tail
    return out


def _fix_a_slash_b(s: str) -> str:
    # "3/4" -> \frac{3}{4}, only when both sides are plain integers written canonically
    parts = s.split("/")
    if len(parts) != 2:
        return s
    # upstream catches only its assertion: a side that is not an integer raises, and the comparison
    # falls back to the raw strings
    a, b = int(parts[0]), int(parts[1])
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _fix_sqrt(s: str) -> str:
    # \sqrt3 -> \sqrt{3}; a trailing bare \sqrt raises (upstream indexes the empty remainder)
    head, *rest = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:]) for p in rest)


def _strip(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        # units on the right ("5 \text{ cm}"); upstream asserts exactly one such split, and a failed
        # assertion makes the whole comparison fall back to raw equality (see `_strip_equal`)
        splits = s.split("\\text{ ")
        if len(splits) != 2:
            raise ValueError("more than one `\\text{ ` unit")
        s = splits[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    lhs = s.split("=")
    if len(lhs) == 2 and len(lhs[0]) <= 2:
        # "k = 5" -> "5"
        s = lhs[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def _strip_equal(a: str, b: str) -> bool:
    try:
        return _strip(a) == _strip(b)
    except Exception:
        # upstream compares the raw strings when normalising fails (e.g. an empty `\sqrt` at the end)
        return a == b


# --- sympy equivalence ------------------------------------------------------------------------------


class _Alarm:
    """SIGALRM after `seconds` in the main thread (upstream's bound on one comparison); a no-op in other
    threads, where the caller's own timeout is the bound."""

    def __init__(self, seconds: int):
        self.seconds = seconds
        self.armed = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")

    def _fire(self, signum, frame):
        raise TimeoutError("sympy comparison ran past its limit")

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.alarm(self.seconds)

    def __exit__(self, *exc):
        if self.armed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, self.previous)


def _clearly_nonzero(diff) -> bool:
    """Whether `diff` is far from 0 at one point (each free symbol set to its own rational number). If so
    it is not identically 0, and simplify, which keeps an expression's value, cannot return 0 for it: the
    answer upstream's simplify would give, found without simplify (the costly step: a wrong answer or a
    sentence parsed as a product of 30 symbols takes 0.05-0.3 s to simplify, the evaluation about 1 ms).
    Any doubt (no number comes out, a pole, an evaluation error) is False, and simplify decides."""
    import sympy

    try:
        point = {s: sympy.Rational(101 + 37 * i, 59 + 11 * i) for i, s in enumerate(sorted(diff.free_symbols, key=str))}
        value = complex(sympy.N(diff.subs(point), 30))
    except Exception:
        return False
    return all(isfinite(part) for part in (value.real, value.imag)) and abs(value) > 1e-9


def sympy_equal(a: str, b: str, seconds: int = SYMPY_SECONDS) -> bool:
    """Whether sympy simplifies parse(a) - parse(b) to 0; False on any parse or algebra failure and on the
    time limit, as upstream."""
    import sympy
    from sympy.parsing.latex import parse_latex

    try:
        with _Alarm(seconds):
            diff = parse_latex(a) - parse_latex(b)
            if _clearly_nonzero(diff):
                return False
            return bool(sympy.simplify(diff) == 0)
    except ImportError:
        raise  # a missing antlr4 runtime must not read as "wrong answer"
    except Exception:
        return False


def warm() -> None:
    """Import sympy and build the LaTeX parser's tables (the first parse costs ~0.5 s, later ones ~10 ms)."""
    import sympy
    from sympy.parsing.latex import parse_latex

    sympy.simplify(parse_latex("\\frac{1}{2}") - parse_latex("x"))


def equivalent(candidate: str, truth: str) -> bool:
    # the string test first: it decides most matches in microseconds, and upstream ORs the two tests, so
    # the order changes only the cost, never the result
    return _strip_equal(candidate, truth) or sympy_equal(candidate, truth)


def verify(response: str, ground_truth) -> float:
    """1.0 when any candidate answer of `response` is equivalent to `ground_truth`, else 0.0. (A row whose
    ground truth is a list pairs each item with its own verifier: `olmax.rewards.verifiers.reward`.)"""
    truth = str(ground_truth)
    return 1.0 if any(equivalent(candidate, truth) for candidate in candidates(response)) else 0.0
