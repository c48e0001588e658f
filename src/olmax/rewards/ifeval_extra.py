"""The 29 IFEval constraints open-instruct added for RL data (IFEvalG) that lm-eval's IFEval lacks.

Upstream: allenai/open-instruct `open_instruct/IFEvalG/instructions.py` and `instructions_registry.py` at
42aa63c (identical at 9ade62d), the classes registered after "New Constraints!" (and `letters:`,
`count:`, `first_word:`, `last_word:`, `paragraphs:` ids). Re-written here as plain functions
`check(answer, **kwargs) -> bool`, keeping upstream's results, quirks included (the reward is what AI2
trained with): keywords are regular expressions, not escaped; `repeat_phrase` looks only at the last
phrase's difference count; `counting_composition` fails on an empty paragraph at either end.

One deliberate change: upstream draws a random value for a missing (or falsy) kwarg, which makes the
check itself random; here a missing kwarg raises ValueError (the safe `score` counts it as "error"). A
falsy but given value is used as given (upstream would redraw `n_start=0` at random).

Sentence splitting is lm-eval's `instructions_util.split_into_sentences`, the same function as
IFEvalG's; word tokenizing is NLTK's `word_tokenize`, as upstream, which needs NLTK's `punkt_tab` data
(`count_unique`, `counting_composition`, `keyword_specific_position`, `start_end`).
"""

from __future__ import annotations

import re
from collections import Counter

from olmax.extras import require

_RELATIONS = ("less than", "at least")


def _util():
    return require("lm_eval.tasks.ifeval.instructions_util", "the ifeval reward")


def _sentences(text: str) -> list[str]:
    return _util().split_into_sentences(text)


def _tokens(text: str) -> list[str]:
    return _util().nltk.word_tokenize(text)


def _needed(name: str, value):
    # upstream would draw a random value here (module docstring)
    if value is None or value == "" or value == []:
        raise ValueError(f"IFEval constraint needs `{name}` (upstream would draw it at random)")
    return value


def _word(value) -> str:
    # a keyword given as a list counts by its first item (upstream's first_word_sent and friends)
    return (value if isinstance(value, str) else value[0]).strip()


def _same_text(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text, flags=re.IGNORECASE))


def _compare(actual: int, relation: str, n: int) -> bool:
    if relation not in _RELATIONS:
        raise ValueError(f"relation must be one of {_RELATIONS}, not {relation!r}")
    return actual < n if relation == "less than" else actual >= n


def _paragraphs_ok(parts: list[str], wanted: int) -> bool:
    # empty pieces are allowed only at either end (a leading or trailing divider), and do not count
    count = len(parts)
    for i, part in enumerate(parts):
        if not part.strip():
            if i not in (0, len(parts) - 1):
                return False
            count -= 1
    return count == wanted


def repeat_phrase(answer, phrase=None, small_n=None):
    words = _needed("phrase", phrase).strip().split()
    found = re.findall(f"{words[0]} .*? {words[-1]}", answer)
    if len(found) != _needed("small_n", small_n):
        return False
    if not found:
        raise ValueError("repeat_phrase with small_n=0 has no phrase to check")  # upstream: UnboundLocalError
    for candidate in found:
        got = candidate.split()
        if len(got) != len(words):
            return False
        differences = sum(a != b for a, b in zip(got, words))
        if differences > 1:
            return False
    # upstream tests the count of the last phrase only: each may differ by at most one word, and the last
    # must differ by exactly one
    return differences == 1


def copy(answer, prompt_to_repeat=None):
    return _same_text(answer, _needed("prompt_to_repeat", prompt_to_repeat))


def copy_span_idx(answer, prompt_to_repeat=None, n_start=None, n_end=None):
    prompt = _needed("prompt_to_repeat", prompt_to_repeat)
    start, end = _needed("n_start", n_start), _needed("n_end", n_end)
    return _same_text(answer, prompt[start:end])


def sentence_hyphens(answer):
    # the pieces between hyphens must be the sentences, unpadded
    gold = _sentences(answer.replace("-", " "))
    return all(piece == piece.strip() and piece == sentence for piece, sentence in zip(answer.split("-"), gold))


def no_adjacent_consecutive(answer):
    words = answer.split()
    for left, right in zip(words, words[1:]):
        a, b = left[0].lower(), right[0].lower()
        if len(a) != 1 or len(b) != 1 or ord(b) - ord(a) == 1:
            return False
    return True


def square_brackets(answer):
    return all(w.startswith("[") and w.endswith("]") for w in answer.split())


def word_once(answer, keyword=None):
    return _count(_needed("keyword", keyword).strip(), answer) == 1


def word_count_different_numbers(answer, keyword=None, frequency=None, relation=None):
    n = _needed("frequency", frequency)
    if n < 0:
        raise ValueError("frequency must be >= 0")
    return _compare(_count(_needed("keyword", keyword).strip(), answer), _needed("relation", relation), n)


def exclude_word_harder(answer, keyword=None, instruction=None):
    return f" {_needed('keyword', keyword).strip()} " not in answer


def paragraphs(answer):
    return _paragraphs_ok(re.split(r"\s?\*\*\*\s?", answer), 2)


def paragraphs2(answer):
    return _paragraphs_ok(answer.split("\n\n"), 2)


def first_word_sent(answer, first_word=None):
    want = _word(_needed("first_word", first_word)).lower()
    return all(s.strip() and s.split()[0].strip().lower() == want for s in _sentences(answer))


def first_word_answer(answer, first_word=None):
    want = _needed("first_word", first_word).strip().lower()
    return bool(answer.strip()) and answer.split()[0].strip().lower() == want


def _last_word(text: str) -> str:
    return re.sub(r"[^\w\s]", "", text.split()[-1].strip()).lower()


def last_word_sent(answer, last_word=None):
    want = _word(_needed("last_word", last_word)).lower()
    return all(s.strip() and _last_word(s) == want for s in _sentences(answer))


def last_word_answer(answer, last_word=None):
    # an empty answer raises, as upstream (the verifier has already scored an empty answer 0)
    return _last_word(answer) == _needed("last_word", last_word).strip().lower()


def bigram_wrapping(answer):
    words = answer.split()
    return all(words[i].startswith("<<") and words[i + 1].endswith(">>") for i in range(0, len(words) - 1, 2))


def copying_simple(answer, prompt_to_repeat=None):
    return _same_text(answer, _needed("prompt_to_repeat", prompt_to_repeat))


def copying_multiple(answer, prompt_to_repeat=None, N=None):  # noqa: N803 (upstream's kwarg name)
    prompt = _needed("prompt_to_repeat", prompt_to_repeat)
    copies = answer.split("******")
    return len(copies) == _needed("N", N) and all(_same_text(c, prompt) for c in copies)


def punctuation_dot(answer):
    return "." not in answer


def punctuation_exclamation(answer):
    return "!" not in answer


def lowercase_counting(answer, N=None):  # noqa: N803
    return len(re.findall(r"\b[a-z]+\b", answer)) <= _needed("N", N)


def letter_counting(answer, N=None, relation=None):  # noqa: N803
    letters = len(re.findall(r"[a-zA-Z]", answer))
    relation, n = _needed("relation", relation), _needed("N", N)
    # upstream does not check this relation: an unknown one fails the constraint
    return relation in _RELATIONS and _compare(letters, relation, n)


def letter_counting2(answer, letter=None, let_frequency=None, let_relation=None):
    letter = _needed("letter", letter)
    if len(letter) > 1 or not ("a" <= letter.lower() <= "z"):
        raise ValueError(f"letter must be one ASCII letter, not {letter!r} (upstream would draw one at random)")
    n = _needed("let_frequency", let_frequency)
    if n < 0:
        raise ValueError("let_frequency must be >= 0")
    return _compare(Counter(answer.lower())[letter.strip().lower()], _needed("let_relation", let_relation), n)


def counting_composition(answer, n_sent=None, n_words=None):
    n_sent, n_words = _needed("n_sent", n_sent), _needed("n_words", n_words)
    parts = re.split(r"\s?\*\*\*\s?", answer)
    if not _paragraphs_ok(parts, 3):
        return False
    # every piece, an empty one at either end included, must hold n_sent sentences of n_words tokens
    for part in parts:
        sentences = _sentences(part)
        if len(sentences) != n_sent or any(len(_tokens(s)) != n_words for s in sentences):
            return False
    return True


def count_unique(answer):
    tokens = _tokens(answer)
    return len(tokens) == len(set(tokens))


def count_increment_word(answer, keyword1=None, keyword2=None):
    once, twice = _needed("keyword1", keyword1).strip(), _needed("keyword2", keyword2).strip()
    return _count(once, answer) == 1 and _count(twice, answer) == 2


def palindrome(answer):
    return any(w == w[::-1] for w in answer.split())


def keyword_specific_position(answer, keyword=None, n=None, m=None):
    keyword, n, m = _word(_needed("keyword", keyword)), _needed("n", n), _needed("m", m)
    sentences = _sentences(answer)
    if len(sentences) < n:
        return False
    tokens = _tokens(sentences[n - 1])
    return len(tokens) >= m and tokens[m - 1] == keyword


def start_end(answer):
    tokens = _tokens(answer)
    return len(tokens) >= 2 and tokens[0].lower() == tokens[-1].lower()


CHECKS = {
    "copy:repeat_phrase": repeat_phrase,
    "copy:copy": copy,
    "new:copy_span_idx": copy_span_idx,
    "detectable_format:sentence_hyphens": sentence_hyphens,
    "keywords:no_adjacent_consecutive": no_adjacent_consecutive,
    "detectable_format:square_brackets": square_brackets,
    "keywords:word_once": word_once,
    "keywords:word_count_different_numbers": word_count_different_numbers,
    "keywords:exclude_word_harder": exclude_word_harder,
    "paragraphs:paragraphs": paragraphs,
    "paragraphs:paragraphs2": paragraphs2,
    "first_word:first_word_sent": first_word_sent,
    "first_word:first_word_answer": first_word_answer,
    "last_word:last_word_sent": last_word_sent,
    "last_word:last_word_answer": last_word_answer,
    "detectable_format:bigram_wrapping": bigram_wrapping,
    "copy:copying_simple": copying_simple,
    "copy:copying_multiple": copying_multiple,
    "punctuation:punctuation_dot": punctuation_dot,
    "punctuation:punctuation_exclamation": punctuation_exclamation,
    "count:lowercase_counting": lowercase_counting,
    "letters:letter_counting": letter_counting,
    "letters:letter_counting2": letter_counting2,
    "count:counting_composition": counting_composition,
    "count:count_unique": count_unique,
    "count:count_increment_word": count_increment_word,
    "keywords:palindrome": palindrome,
    "keywords:keyword_specific_position": keyword_specific_position,
    "keywords:start_end": start_end,
}
