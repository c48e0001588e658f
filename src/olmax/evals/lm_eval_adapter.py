"""The lm-eval-harness model `olmax` (lm-eval 0.4.13, the `eval` extra), and offline task data.

Importing this module registers the model; lm-eval's own `lm_eval` script does not import it, so:

    olmax lm-eval --model olmax --model_args ckpt=CKPT,tokenizer=dolma2 --tasks arc_easy
    olmax eval tasks --ckpt CKPT --tasks arc_easy,hellaswag --data-dir evals/

Requests are handled as lm-eval's own HF backend (`HFLM`) handles them, so that a checkpoint and its
HF conversion score identically (tests/evals/test_evals_lm_eval.py checks per-request log-likelihoods and
accuracy against HFLM on a converted model):

- loglikelihood: lm-eval's TemplateLM splits context and continuation into tokens; the input is
  (context + continuation)[-(max_length + 1):][:-1], the continuation's log-probabilities are summed
  over the REAL vocabulary (a HF model has no padded ids), and `is_greedy` is whether every
  continuation token is the argmax. Requests are batched longest first, padded on the right to a
  power of two (a causal model's earlier positions do not see the padding).
- loglikelihood_rolling: lm-eval's rolling windows (max_length tokens, one token of context) scored
  as above and summed.
- generate_until: the rollout sampler (olmax.rollout.sampler: one jitted decoding loop with a key/value
  cache), prompts left-truncated to max_length - max_gen_toks, stopped on the device at the token whose
  decoded text completes one of the request's `until` strings (which is cut off) or at EOS, requests
  batched by their `until` strings as HFLM batches by gen_kwargs; the text leaves out the tokenizer's
  special tokens (HFLM decodes with skip_special_tokens=True).
  Greedy unless the task's gen_kwargs say `do_sample: true`, as HFLM passes them to transformers'
  `generate`: then sampled at `temperature` (> 0) with `top_p` (default 1) and `top_k` (default 50,
  transformers 5.24's GenerationConfig default, which an export's generation_config.json leaves in
  place), each request's draws keyed by the model's `seed` and its position in the call.
- Chat templates (`--apply_chat_template`, `--system_instruction`): lm-eval renders every request with
  `apply_chat_template(chat_history, add_generation_prompt)`; here that is the OLMo 3 template named by
  model_args `chat_template` (instruct or think, olmax.data.chat), rendered as HFLM renders it from a
  `convert --to-hf --chat` export's tokenizer: with `continue_final_message` when there is no generation
  prompt (a task's `gen_prefix`: the text stops where the final message does).
- The sliding window is respected everywhere: scoring runs the model's own windowed forward pass,
  and the decoder masks the cache with each layer's window.

Offline tasks: `offline_datasets(data_dir)` makes lm-eval read each task's dataset from local copies
instead of the hub: `DATA_DIR/<task>/<split>/*.arrow` (HF `datasets` arrow stream files, as
`save_to_disk` writes them) or `DATA_DIR/<task>/<split>.jsonl`, and for task families whose subtasks
share one dataset path, `DATA_DIR/<family>/<dataset_name>/...` (MMLU: `mmlu/anatomy/dev/*.arrow`).
A copy of another hub version of a dataset is mapped to the columns the task reads (boolq: google/boolq's
`answer` -> super_glue's `label`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from olmax.checkpoint.inference import eval_mesh, load_checkpoint
from olmax.data import chat
from olmax.data.tokenizer import load_tokenizer
from olmax.evals.scoring import TokenScorer, eval_seq_len
from olmax.objectives.cross_entropy import IGNORE
from olmax.rollout.sampler import Sampling, generate
from olmax.rollout.text import stop_table

MIN_WIDTH = 16
# transformers' continue_final_message marker (utils/chat_template_utils.py, 5.24): appended to the final
# message before rendering; the rendered text is cut where it stands.
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


@register_model("olmax")
class OlmaxLM(TemplateLM):
    """An olmax checkpoint as an lm-eval model (see the module doc).

    model_args: ckpt (required), tokenizer (dolma2 or a tokenizer.json), batch_size, max_length
    (default: the checkpoint's training data.seq_len, else the config's max_position; never above
    max_position: olmax.evals.scoring.eval_seq_len), max_gen_toks (256), step, dtype (compute dtype
    override).
    """

    def __init__(
        self,
        ckpt: str,
        tokenizer: str = "dolma2",
        batch_size: int | str = 8,
        max_length: Optional[int] = None,
        max_gen_toks: int = 256,
        step: Optional[int] = None,
        dtype: Optional[str] = None,
        chat_template: Optional[str] = None,
        seed: int = 0,
        **_harness_args,
    ):
        # simple_evaluate also passes max_batch_size and device: placement is the mesh's business here.
        super().__init__()
        mesh = eval_mesh()
        self.params, self.cfg, self.meta = load_checkpoint(
            ckpt, mesh, step=None if step is None else int(step), compute_dtype=dtype
        )
        self.scorer = TokenScorer(self.cfg, mesh, real_vocab=True)
        self.tok = load_tokenizer(tokenizer)
        self.tokenizer_spec = tokenizer
        self._decode = self.tok.decode
        if chat_template is not None:
            chat.template_text(chat_template)  # an unknown name is an error now, not at the first request
            chat.check_chat_tokenizer(self.tok)
        self.chat = chat_template
        self.seed = int(seed)
        self.batch_size = 8 if batch_size in ("auto", None) else int(batch_size)
        self.max_length = eval_seq_len(
            None if max_length is None else int(max_length), ckpt, self.meta["step"], self.cfg
        )
        self.max_gen_toks = int(max_gen_toks)
        self._stop_tables: dict[tuple[str, ...], np.ndarray] = {}

    @property
    def eot_token_id(self) -> int:
        return self.tok.info.eos_token_id

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> list[int]:
        return self.tok.encode(string)  # OLMo 3 has no BOS: nothing to add

    def tok_decode(self, ids) -> str:
        return self._decode(list(ids))

    # -- chat templates --------------------------------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        """Keys lm-eval's request cache: the tokenizer and the template."""
        return f"{self.tokenizer_spec.replace('/', '__')}__olmo3_{self.chat}"

    def _template(self, asked: bool | str = True) -> str:
        if self.chat is None or asked not in (True, self.chat):
            raise ValueError(
                f"--apply_chat_template {asked if isinstance(asked, str) else ''}needs the olmax model's "
                f"chat_template model_arg (instruct or think; olmax lm-eval --apply_chat_template NAME sets it), "
                f"got chat_template={self.chat}"
            )
        return self.chat

    def chat_template(self, chat_template: bool | str = False) -> Optional[str]:
        """The Jinja source lm-eval records in its results (None: no template asked for)."""
        return chat.template_text(self._template(chat_template)) if chat_template else None

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        name = self._template()
        eos = self.tok_decode([self.eot_token_id])
        if add_generation_prompt:
            return chat.render(name, chat_history, eos, add_generation_prompt=True)
        # HFLM asks for continue_final_message here (lm-eval 0.4.13, models/huggingface.py)
        history = [*chat_history[:-1], {**chat_history[-1], "content": chat_history[-1]["content"] + CONTINUE_TAG}]
        text = chat.render(name, history, eos)
        return text[: text.rindex(CONTINUE_TAG)]

    # -- scoring ---------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        rows = []
        for key, context, continuation in requests:
            if not continuation:
                raise ValueError(f"request {key!r} has an empty continuation")
            inp = (list(context) + list(continuation))[-(self.max_length + 1) :][:-1]
            rows.append((inp, list(continuation)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        results: list[Optional[tuple[float, bool]]] = [None] * len(rows)
        for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm, desc="olmax loglikelihood"):
            idx = order[start : start + self.batch_size]
            width = max(MIN_WIDTH, 1 << (len(rows[idx[0]][0]) - 1).bit_length())
            span = 1 << (max(len(rows[i][1]) for i in idx) - 1).bit_length()
            tokens = np.zeros((len(idx), width), np.int32)
            positions = np.zeros((len(idx), span), np.int32)
            labels = np.full((len(idx), span), IGNORE, np.int32)
            for r, i in enumerate(idx):
                inp, cont = rows[i]
                tokens[r, : len(inp)] = inp
                # position p predicts token p + 1: the continuation's tokens are predicted at its last len(cont)
                positions[r, : len(cont)] = np.arange(len(inp) - len(cont), len(inp))
                labels[r, : len(cont)] = cont
            nll, greedy = self.scorer.at_positions(self.params, tokens, positions, labels)
            scored = labels != IGNORE
            for r, i in enumerate(idx):
                answer = (-float(np.sum(nll[r][scored[r]], dtype=np.float64)), bool(greedy[r][scored[r]].all()))
                results[i] = answer
                key = requests[i][0]
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for n, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(
                lm_utils.make_disjoint_window,
                lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((None, context, continuation))
                owner.append(n)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for n, (logprob, _) in zip(owner, scores):
            totals[n] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    # -- generation ------------------------------------------------------------------------------

    def _request_settings(self, gen_kwargs: dict) -> tuple[list[str], int, Sampling]:
        kwargs = dict(gen_kwargs)
        sampling = Sampling()
        # HFLM samples only when do_sample is true: a temperature alone leaves transformers greedy
        if kwargs.get("do_sample"):
            temperature = float(kwargs.get("temperature", 0.0))
            if temperature <= 0:
                raise ValueError(f"do_sample needs a temperature > 0 (as transformers does), got {temperature}")
            top_p, top_k = float(kwargs.get("top_p", 1.0)), int(kwargs.get("top_k", 50))
            sampling = Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=self.seed)
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        eos_text = self.tok_decode([self.eot_token_id])
        if eos_text not in until:
            until.append(eos_text)
        return until, int(kwargs.pop("max_gen_toks", self.max_gen_toks)), sampling

    def _stop_table(self, until: tuple[str, ...]):
        """The text-stop automaton of `until` over the tokenizer (built once per set of strings)."""
        if until not in self._stop_tables:
            self._stop_tables[until] = stop_table(self.tok, until)
        return self._stop_tables[until]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        prepared = []
        for req in requests:
            context, gen_kwargs = req.args
            until, max_new, sampling = self._request_settings(gen_kwargs)
            prompt = self.tok_encode(context)[-max(1, self.max_length - max_new) :] or [self.prefix_token_id]
            prepared.append((prompt, until, max_new, sampling))
        # a batch holds one sampling setting (Sampling is hashable) and one set of `until` strings, as
        # HFLM batches requests by their gen_kwargs (a row must not stop at another request's string);
        # longest prompts first
        groups: dict[tuple, list[int]] = {}
        for i in sorted(range(len(prepared)), key=lambda i: -len(prepared[i][0])):
            groups.setdefault((prepared[i][3], tuple(prepared[i][1])), []).append(i)
        batches = [g[s : s + self.batch_size] for g in groups.values() for s in range(0, len(g), self.batch_size)]
        outputs: list[str] = [""] * len(prepared)
        for idx in tqdm(batches, disable=disable_tqdm, desc="olmax generate"):
            until = tuple(u for u in prepared[idx[0]][1] if u)
            generated = generate(
                self.params,
                self.cfg,
                [prepared[i][0] for i in idx],
                max(prepared[i][2] for i in idx),
                sampling=prepared[idx[0]][3],
                index=idx,
                # the device stops a row at EOS, at its max_gen_toks, or at the token whose decoded text
                # completes an `until` string, however the model spelled it (olmax.rollout.text)
                eos_ids=[self.eot_token_id],
                limits=[prepared[i][2] for i in idx],
                stop_text=self._stop_table(until) if until else None,
            )
            for i, ids in zip(idx, generated):
                # HFLM decodes with skip_special_tokens=True: a chat model's <|im_end|> is not in the text
                text = self.tok_decode([t for t in ids if t not in self.tok.special_ids])
                for u in prepared[i][1]:
                    if u:
                        text = text.split(u)[0]
                outputs[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return outputs


# -- offline task data --------------------------------------------------------------------------


def _read_split(path: Path):
    """A `datasets.Dataset` from a split directory of arrow stream files or a .jsonl file."""
    import datasets
    import pyarrow as pa
    import pyarrow.ipc

    if path.suffix == ".jsonl":
        return datasets.Dataset.from_json(str(path))
    tables = []
    for f in sorted(path.glob("*.arrow")):
        with pa.OSFile(str(f), "rb") as source:
            tables.append(pyarrow.ipc.open_stream(source).read_all())
    return datasets.Dataset(pa.concat_tables(tables))


def local_dataset(data_dir: Path, task: str, dataset_name: Optional[str]):
    """The DatasetDict of `task` under `data_dir` (layouts in the module doc), or None if absent."""
    import datasets

    family = task.split("_")[0]
    candidates = [data_dir / task] + ([data_dir / family / dataset_name] if dataset_name else [])
    for root in candidates:
        splits = (
            {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and any(p.glob("*.arrow"))}
            if root.is_dir()
            else {}
        )
        splits.update({p.stem: p for p in sorted(root.glob("*.jsonl"))} if root.is_dir() else {})
        if splits:
            found = datasets.DatasetDict({name: _read_split(p) for name, p in splits.items()})
            return _to_task_schema(task, found)
    return None


def _to_task_schema(task: str, found):
    """Local copies of another hub version of a task's dataset, renamed to the columns lm-eval's task
    reads. boolq: google/boolq (`answer`: bool, as local copies often have it) -> super_glue/boolq
    (`label`: 0 = no, 1 = yes), the copy lm-eval's boolq task is written for."""
    if task == "boolq" and all("answer" in d.column_names and "label" not in d.column_names for d in found.values()):
        return found.map(lambda doc: {"label": int(doc["answer"])})
    return found


@contextlib.contextmanager
def offline_datasets(data_dir: str | Path):
    """While active, lm-eval tasks load their datasets from `data_dir` (a missing one is an error
    naming the paths tried) instead of the hub."""
    from lm_eval.api.task import ConfigurableTask

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"task data directory {data_dir} does not exist")
    original = ConfigurableTask.download

    def download(task_self, dataset_kwargs=None, **kwargs):
        name = task_self.config.task
        found = local_dataset(data_dir, name, task_self.DATASET_NAME)
        if found is None:
            raise FileNotFoundError(
                f"no local data for task {name} under {data_dir}: expected {data_dir / name}/<split>/*.arrow"
                + (
                    f" or {data_dir / name.split('_')[0] / task_self.DATASET_NAME}/<split>/*.arrow"
                    if task_self.DATASET_NAME
                    else ""
                )
            )
        task_self.dataset = found
        # Local copies often hold fewer splits than the hub (often validation only); a
        # split the task names but the copy lacks is dropped, so lm-eval falls back as it does for
        # tasks without that split (e.g. scoring validation when there is no test split).
        for attr in ("training_split", "validation_split", "test_split", "fewshot_split"):
            if getattr(task_self.config, attr, None) not in (None, *found):
                setattr(task_self.config, attr, None)

    ConfigurableTask.download = download
    try:
        yield
    finally:
        ConfigurableTask.download = original
