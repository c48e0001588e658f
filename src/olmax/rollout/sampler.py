"""The rollout sampler: prefill, then decode until every row has stopped, as ONE jitted program (a
`jax.lax.while_loop` over new tokens, no host round trip per token). It serves GRPO rollouts (`sample`,
n samples per prompt, from inside the trainer on its mesh), `olmax generate` and lm-eval's
generate_until (`generate`, `generate_in_batches`). docs/rollout.md describes it; the pieces:

- Prefill: the prompts, left-padded to a power of two (so that every row's next token has the same
  time and a decoding step writes one cache slot for all rows), in one pass over olmax.rollout.cache's
  cached forward; with `n` > 1 each prompt's prefill is computed ONCE and its cache rows and last
  logits are repeated to its n samples (rows i*n .. i*n + n - 1 are prompt i's), as GRPO's groups need.
- Choice: each next token is chosen from the logits of the REAL vocabulary (a HF export has no padded
  rows). Temperature 0: the argmax (greedy), as transformers' `generate(do_sample=False)`. Temperature
  > 0: the logits are divided by the temperature, then top-k keeps the k largest and top-p the smallest
  set of most likely tokens whose probabilities reach p (always at least one), in that order, as
  transformers' logits processors do; the token is drawn from what remains, each with its softmax
  probability to float32 rounding (olmax.rollout.draw). The draw for request row i's t-th new token
  (t = 0, 1, ...) uses the key fold_in(fold_in(key(seed), t), i), where i is the row's position in the
  WHOLE request (`index`), not in a batch: the same seed, prompts and settings give the same tokens
  whatever the batch size, and the samples of one prompt get their own draws.
- Log-probs: every chosen token's log-probability in float32 under log_softmax(logits / T) over the
  real vocabulary, T the temperature (1 when greedy), BEFORE top-k / top-p truncation: the policy's
  own probability, which the trainer recomputes from `olmax.model.olmo3.forward` (tests prove the two
  equal within 1e-5 in float32). vLLM's `logprobs` are of the raw logits by default
  (`logprobs_mode="raw_logprobs"`), so an RL recipe on vLLM must rescale by T itself; here it is built in.
- Stops, per row, checked on device after each token: max_new_tokens (or the row's own `limits`), an
  EOS id (`eos_ids`, kept in the output) and stop strings on the decoded text (`stop_text`,
  olmax.rollout.text.stop_table's automaton, one state per row: the token completing a string is the
  last kept, however the model spelled it, as vLLM's stop strings).
- Sharding: with `mesh`, the program is jitted with the parameters laid out as the trainer lays them
  out (olmax.model.olmo3.param_shardings, the rules table of olmax.model.sharding), the batch over (data, fsdp), and
  the cache as olmax.rollout.cache.cache_spec says; tests/rollout/test_rollout_sampler.py checks that 8 CPU
  devices give the tokens and log-probs of one.

A GRPO step's rows need not fit one program: `prompts_per_program` (grpo.sample_prompts) runs it on
that many prompts at a time, the same tokens as one program (the draws are keyed by `index`), and
olmax.rollout.compile_decode says how many fit a chip.

Shapes are bucketed so a few programs serve many requests: the prompt width and the cache length are
rounded up to powers of two, and the loop's width is cache length - prompt width (max_new_tokens is an
argument, not a shape).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from olmax.config.model import ModelConfig
from olmax.model.sharding import logical_to_spec, place
from olmax.rollout.cache import cached_forward, init_cache
from olmax.rollout.draw import draw, draw_scored

FINISH = ("length", "eos", "stop")  # Rollout.finish codes: FINISH[code]
_NEVER = -1  # the EOS table's padding: no token has this id


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (module doc). temperature 0 is greedy; top_k 0 and top_p 1 are off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"sampling needs temperature >= 0, 0 < top_p <= 1 and top_k >= 0, got {self}")

    @property
    def draw(self) -> str:
        """The choice the programs are compiled for: "greedy" (temperature 0), "sample" (a draw from the
        tempered distribution, GRPO's) or "truncate" (top-k / top-p cut it first). The settings' values
        are the programs' arguments (new values need no recompilation), this kind is not: truncating
        sorts the vocabulary, and the sort of 64 rows of dolma2's 100k logits is 11 s of the 14 s the
        TPU compiler (libtpu, for a v5e) takes for a sampled decoding loop of the demo's tiny model."""
        if self.temperature == 0:
            return "greedy"
        return "truncate" if self.top_k > 0 or self.top_p < 1 else "sample"


class Rollout(NamedTuple):
    """What `sample` returns, one row per sample (prompt i's n samples are rows i*n .. i*n + n - 1).
    tokens and logprobs are (rows, max_new_tokens), zero after a row's length."""

    tokens: jax.Array  # int32 new tokens, the stopping EOS / stop string's last token included
    logprobs: jax.Array  # float32 log_softmax(logits / T)[token] over the real vocabulary (module doc)
    lengths: jax.Array  # int32 new tokens per row
    finish: jax.Array  # int32 index into FINISH


def _bucket(n: int, minimum: int = 16) -> int:
    return max(minimum, 1 << (n - 1).bit_length())


def choose_scored(
    logits: jnp.ndarray, keys: Optional[jnp.ndarray], rule: Optional[jnp.ndarray], truncate: bool
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`choose_with_keys`'s tokens and their log-probs (token_logprobs: under log_softmax(logits / T),
    before any cut, T 1 when greedy). A sampled draw that cuts nothing (GRPO's) scores its token from
    the draw's own pass over the row (olmax.rollout.draw.draw_scored)."""
    if rule is not None and not truncate:
        return draw_scored(logits / rule[0], keys)
    token = choose_with_keys(logits, keys, rule, truncate)
    return token, token_logprobs(logits, token, jnp.float32(1.0) if rule is None else rule[0])


def choose_with_keys(
    logits: jnp.ndarray, keys: Optional[jnp.ndarray], rule: Optional[jnp.ndarray], truncate: bool
) -> jnp.ndarray:
    """The next token of each row from float32 logits (B, V) over the real vocabulary. `rule` is None
    (greedy) or (temperature, top_k, top_p) as an array, so new values need no recompilation (`truncate`:
    whether top-k / top-p may cut, Sampling.draw). keys (B,) (None when greedy): row r's PRNG key,
    fold_in(fold_in(key(seed), t), i) for its t-th new token and its position i in the whole request
    (the slot engine's rows are at different t in one step: each brings its own; olmax.rollout.engine)."""
    if rule is None:
        return _argmax(logits)
    temperature, top_k, top_p = rule[0], rule[1].astype(jnp.int32), rule[2]
    logits = logits / temperature

    def cut(logits):  # top-k, then top-p, over the sorted logits
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        kth = jnp.where(top_k > 0, ordered[:, jnp.maximum(top_k, 1) - 1], -jnp.inf)[:, None]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
        ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
        kept = jnp.where((before < top_p) | (top_p >= 1), ordered, jnp.inf)  # the first is always kept
        return jnp.where(logits < jnp.min(kept, axis=-1, keepdims=True), -jnp.inf, logits)

    # the sort is most of a sampled step's time on a CPU (a 64 x 4096 sort: ~80 ms, the model ~7 ms) and
    # of its compiling on a TPU (Sampling.draw): plain temperature sampling, GRPO's, has none
    if truncate:
        logits = jax.lax.cond((top_k > 0) | (top_p < 1), cut, lambda x: x, logits)
    # the tree draw of olmax.rollout.draw: 17 random words a row, each token drawn with its softmax
    # probability to float32 rounding (jax.random.categorical's Gumbel-max would draw 100k a row)
    return draw(logits, keys)


def _argmax(logits: jnp.ndarray, block: int = 128) -> jnp.ndarray:
    """jnp.argmax over the last axis of (B, V), the same index (the first largest), in two steps: the
    largest of each block of `block` entries, then the first block holding the row's largest and the
    first largest within it. XLA's CPU argmax is a two-operand reduction that is not vectorised: over
    64 x 100k logits it took 28-30 ms on the 2-core development machine, more than the output layer's
    matmul; a one-operand max and a 128-wide argmax take 7 ms (docs/rollout.md, Benchmark)."""
    b, v = logits.shape
    padded = jnp.pad(logits, ((0, 0), (0, -v % block)), constant_values=-jnp.inf)
    first = jnp.argmax(jnp.max(padded.reshape(b, -1, block), axis=-1), axis=-1)
    within = jax.vmap(lambda row, f: jax.lax.dynamic_slice(row, (f * block,), (block,)))(padded, first)
    return (first * block + jnp.argmax(within, axis=-1)).astype(jnp.int32)


def token_logprobs(logits: jnp.ndarray, tokens: jnp.ndarray, temperature) -> jnp.ndarray:
    """log_softmax(logits / temperature)[tokens] in float32, logits (..., real vocab): the log-probs the
    sampler returns and the trainer recomputes."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def _text_table(table: Optional[np.ndarray], vocab: int) -> np.ndarray:
    """The text-stop automaton (olmax.rollout.text.stop_table: next state per state and token, -1 where
    a stop string ends) over the model's vocabulary, its states rounded up to a power of two (at least
    16; padding states are never entered); without stop strings one state that never stops. A
    tokenizer's ids beyond the model's vocabulary are never drawn; the model's beyond the tokenizer's
    have no text and go back to state 0."""
    if table is None:
        return np.zeros((1, vocab), np.int32)
    if table.ndim != 2:
        raise ValueError(f"stop_text needs a (states, tokens) table, got shape {table.shape}")
    out = np.zeros((_bucket(table.shape[0]), vocab), np.int32)
    out[: table.shape[0], : table.shape[1]] = table[:, :vocab]
    return out


def _eos_table(ids: Sequence[int]) -> np.ndarray:
    ids = list(ids)
    return np.asarray(ids + [_NEVER] * (_bucket(max(1, len(ids)), 4) - len(ids)), np.int32)


def _loop(cfg: ModelConfig, n: int, steps: int, draw: str, logprobs: bool, cut_head: bool):
    """The rollout as one function of arrays (module doc): prefill, the n-fold repeat, the while loop;
    `draw`: Sampling.draw.
    Without `logprobs` (generation) no log-softmax is computed and the log-probs are zero. cut_head:
    the output layer's weight is cut to the real vocabulary once, before the loop, so that no step
    computes the padding's logits and then copies the real ones out of them (a tenth of a greedy
    step of the demo model on a CPU); not on a mesh, where that axis is sharded and the cut would
    move the weight between devices."""
    vocab, sample = cfg.vocab_size, draw != "greedy"

    def run(params, prompts, lengths, limits, index, key_data, rule, eos_ids, texts):
        key = jax.random.wrap_key_data(key_data)  # a host array, placed like the other arguments
        if cut_head:
            params = {**params, "lm_head": params["lm_head"][:, :vocab]}
        p, width = prompts.shape
        length = width + steps
        first = width - lengths  # the prompts are left-padded: row b's first real token's time
        cache = init_cache(cfg, p, length)
        logits, cache = cached_forward(params, cache, prompts, 0, cfg, first, length, last_only=True, fresh=True)
        last = logits[:, 0, :vocab]
        if n > 1:  # each prompt's cache and last logits, computed once, repeated to its n samples
            cache = jax.tree.map(lambda c: jnp.repeat(c, n, axis=c.ndim - 4), cache)
            last, first = jnp.repeat(last, n, axis=0), jnp.repeat(first, n)
        rows = last.shape[0]

        def pick(logits, t):
            keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(key, t), i))(index) if sample else None
            if not logprobs:
                token = choose_with_keys(logits, keys, rule if sample else None, draw == "truncate")
                return token, jnp.zeros(token.shape, jnp.float32)
            return choose_scored(logits, keys, rule if sample else None, draw == "truncate")

        def record(state, t, token, logp):
            out, lps, done, finish, count, text = state
            live = ~done
            out = out.at[:, t].set(jnp.where(live, token, 0))
            lps = lps.at[:, t].set(jnp.where(live, logp, 0.0))
            count = count + live
            eos = live & jnp.any(token[:, None] == eos_ids[None, :], axis=1)
            after = texts[text, token]  # the text-stop automaton's next state; -1: a stop string ended
            stop = live & (after < 0)
            text = jnp.where(live, jnp.maximum(after, 0), text)
            full = live & (count >= limits)
            finish = jnp.where(eos, 1, jnp.where(stop, 2, jnp.where(full, 0, finish)))
            return out, lps, done | eos | stop | full, finish, count, text

        state = (
            jnp.zeros((rows, steps), jnp.int32),
            jnp.zeros((rows, steps), jnp.float32),
            jnp.zeros((rows,), bool),
            jnp.zeros((rows,), jnp.int32),
            jnp.zeros((rows,), jnp.int32),
            jnp.zeros((rows,), jnp.int32),
        )

        # one choice in the program, in the loop: each iteration chooses token t from the logits it
        # carries, then runs it through the model for the next (the last such pass is not needed, but
        # a second copy of the choice, for the prefill's logits, would cost more to compile than it saves)
        def cond(carry):
            t, _, _, state = carry
            return (t < steps) & ~jnp.all(state[2])

        def body(carry):
            t, logits, cache, state = carry
            token, logp = pick(logits, t)
            state = record(state, t, token, logp)
            logits, cache = cached_forward(params, cache, token[:, None], width + t, cfg, first, length)
            return t + 1, logits[:, 0, :vocab], cache, state

        _, _, _, (out, lps, _, finish, count, _) = jax.lax.while_loop(cond, body, (jnp.int32(0), last, cache, state))
        return Rollout(out, lps, count, finish)

    return run


@functools.lru_cache(maxsize=None)
def _compiled(
    cfg: ModelConfig, n: int, steps: int, draw: str, logprobs: bool = True, mesh=None, rows: int = 0, width: int = 0
):
    """The jitted rollout, once per config, group size, loop width, kind of choice (Sampling.draw) and
    with/without log-probs; with a mesh, laid out on it (parameters as the trainer shards them, the batch
    over the batch axes)."""
    run = _loop(cfg, n, steps, draw, logprobs, cut_head=mesh is None)
    if mesh is None:
        return jax.jit(run)
    from olmax.model.olmo3 import param_shardings

    batch = functools.partial(_batch_sharding, mesh)
    ins = (param_shardings(cfg, mesh), *_arg_shardings(mesh, n, rows, width))
    outs = Rollout(batch(rows, steps), batch(rows, steps), batch(rows), batch(rows))
    return jax.jit(run, in_shardings=ins, out_shardings=outs)


def _batch_sharding(mesh, *shape) -> NamedSharding:
    """The leading axis over the batch axes, the rest replicated."""
    return NamedSharding(mesh, logical_to_spec(("batch",) + ("head_dim",) * (len(shape) - 1), shape, mesh))


def _arg_shardings(mesh, n: int, rows: int, width: int) -> tuple:
    """The layout of the rollout's arguments after the parameters (`_loop`'s `run`)."""
    batch, rep = functools.partial(_batch_sharding, mesh), NamedSharding(mesh, PartitionSpec())
    p = rows // n
    return batch(p, width), batch(p), batch(rows), batch(rows), rep, rep, rep, rep


def widths(longest: int, max_new_tokens: int) -> tuple[int, int]:
    """(prompt width, loop width) of a request whose longest prompt has `longest` tokens: the prompt
    width and the cache length (their sum) are powers of two (module doc)."""
    width = _bucket(longest)
    return width, _bucket(width + max_new_tokens) - width


def lower_rollout(params, cfg: ModelConfig, prompts: int, n: int, longest: int, max_new_tokens: int, mesh):
    """The sampled rollout program of `sample`, GRPO's temperature-only draw (Sampling.draw "sample"),
    for `prompts` prompts of at most `longest` tokens, n samples each, on `mesh`, lowered from abstract
    arrays (`params`: ShapeDtypeStructs of the trainer's parameters), as olmax.rollout.compile_decode
    compiles it: nothing is allocated. Its text-stop table has one state; a recipe's stop strings make
    it (16, vocab) int32, a few MB replicated."""
    width, steps = widths(longest, max_new_tokens)
    rows = prompts * n
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    args = (
        ints(prompts, width),  # tokens
        ints(prompts),  # lengths
        ints(rows),  # limits
        ints(rows),  # index
        jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))),  # the key's data
        jax.ShapeDtypeStruct((3,), jnp.float32),  # the sampling rule
        ints(*_eos_table(()).shape),
        ints(*_text_table(None, cfg.vocab_size).shape),
    )
    with jax.set_mesh(mesh):
        return _compiled(cfg, n, steps, "sample", True, mesh, rows, width).lower(params, *args)


def sample(
    params: dict,
    cfg: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    n: int = 1,
    sampling: Sampling = Sampling(),
    eos_ids: Sequence[int] = (),
    stop_text: Optional[np.ndarray] = None,
    index: Optional[Sequence[int]] = None,
    limits: Optional[Sequence[int]] = None,
    mesh=None,
    prompts_per_program: int = 0,
    logprobs: bool = True,
) -> Rollout:
    """`n` samples of each prompt (token ids), in one jitted program; see the module doc.

    stop_text: olmax.rollout.text.stop_table's automaton: a row stops (finish "stop") at the token
    whose decoded text completes one of its stop strings, that token kept.
    index: each ROW's position in the whole request, which keys its draws (default 0 .. len(prompts)*n - 1).
    limits: each row's own max_new_tokens (at most `max_new_tokens`). mesh: a mesh (the trainer's) on
    which `params` are laid out by olmax.model.olmo3.param_shardings; the rollout's arrays come back sharded
    over its batch axes. prompts_per_program: run the program on this many prompts (their n samples
    each) at a time, one after another, so its cache holds that many prompts' rows
    (GRPOConfig.sample_prompts; 0 = all at once); every chunk has the whole request's prompt width and
    loop width, and the draws are keyed by `index`, so the tokens are the one program's (the log-probs
    to float32 rounding). logprobs=False (generation): zeros instead, no log-softmax per step.
    Returns device arrays (Rollout), (len(prompts) * n, max_new_tokens) wide."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1 or n < 1 or prompts_per_program < 0:
        raise ValueError(
            f"max_new_tokens and n must be at least 1 and prompts_per_program at least 0, got "
            f"{max_new_tokens}, {n} and {prompts_per_program}"
        )
    rows = len(prompts) * n
    index = np.arange(rows, dtype=np.int32) if index is None else np.asarray(index, np.int32)
    if index.shape != (rows,):
        raise ValueError(f"index needs one position per row ({rows}), got shape {index.shape}")
    limits = np.full(rows, max_new_tokens, np.int32) if limits is None else np.asarray(limits, np.int32)
    if limits.shape != (rows,) or limits.min() < 1 or limits.max() > max_new_tokens:
        raise ValueError(f"limits needs one value in 1..{max_new_tokens} per row ({rows}), got {limits}")
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    width, steps = widths(int(lengths.max()), max_new_tokens)
    tokens = np.zeros((len(prompts), width), np.int32)
    for r, p in enumerate(prompts):  # left-padded (olmax.rollout.cache: the rows share one clock)
        tokens[r, width - len(p) :] = p
    rule = np.asarray([sampling.temperature or 1.0, sampling.top_k, sampling.top_p], np.float32)
    key_data = np.asarray(jax.random.key_data(jax.random.key(sampling.seed)))
    tables = (key_data, rule, _eos_table(eos_ids), _text_table(stop_text, cfg.vocab_size))
    chunk = prompts_per_program or len(prompts)
    parts = []
    for first in range(0, len(prompts), chunk):
        p = min(chunk, len(prompts) - first)  # the last chunk may be short: its own program
        shape = (p * n, width) if mesh is not None else ()
        run = _compiled(cfg, n, steps, sampling.draw, logprobs, mesh, *shape)
        on = slice(first * n, (first + p) * n)
        args = (tokens[first : first + p], lengths[first : first + p], limits[on], index[on], *tables)
        if mesh is None:
            parts.append(run(params, *args))
        else:  # global arrays: every process holds the whole request (several processes: the RL loop's)
            with jax.set_mesh(mesh):
                parts.append(run(params, *(place(s, a) for s, a in zip(_arg_shardings(mesh, n, p * n, width), args))))
    out = parts[0] if len(parts) == 1 else Rollout(*(jnp.concatenate(x) for x in zip(*parts)))
    return Rollout(*(x[:, :max_new_tokens] if x.ndim == 2 else x for x in out))


def generate(
    params: dict,
    cfg: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampling: Sampling = Sampling(),
    index: Optional[Sequence[int]] = None,
    eos_ids: Sequence[int] = (),
    limits: Optional[Sequence[int]] = None,
    stop_text: Optional[np.ndarray] = None,
) -> list[list[int]]:
    """The new tokens of each prompt (one batch, one `sample` call; `limits`: each row's own
    max_new_tokens, at most `max_new_tokens`). A row ends at max_new_tokens, at an EOS of `eos_ids`
    (kept) or at the token whose decoded text completes a stop string of `stop_text`
    (olmax.rollout.text.stop_table; kept). `index` holds each prompt's position in the whole request,
    which keys its draws (default 0, 1, ...: the batch is the request)."""
    if index is not None and np.shape(index) != (len(prompts),):
        raise ValueError(f"index needs one position per prompt ({len(prompts)}), got shape {np.shape(index)}")
    out = sample(
        params,
        cfg,
        prompts,
        max_new_tokens,
        sampling=sampling,
        eos_ids=eos_ids,
        stop_text=stop_text,
        index=index,
        limits=limits,
        logprobs=False,
    )
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    return [tokens[r, : lengths[r]].tolist() for r in range(len(prompts))]


def generate_in_batches(
    params: dict,
    cfg: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int,
    *,
    sampling: Sampling = Sampling(),
    eos_ids: Sequence[int] = (),
) -> list[list[int]]:
    """The new tokens of each prompt, decoded `batch_size` prompts at a time; each prompt's draws are
    keyed by its position in `prompts`, so the result does not depend on `batch_size`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    out: list[list[int]] = []
    for first in range(0, len(prompts), batch_size):
        batch = prompts[first : first + batch_size]
        index = range(first, first + len(batch))
        out += generate(params, cfg, batch, max_new_tokens, sampling=sampling, index=index, eos_ids=eos_ids)
    return out
