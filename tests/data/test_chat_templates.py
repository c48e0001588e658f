"""The Think DPO and RL template is the one AI2 ran: olmax's `think_dpo_rl` renders every conversation
as open-instruct's `olmo_thinker` does (tests/fixtures/open_instruct_olmo_thinker.jinja, the template
string of open_instruct/dataset_transformation.py's CHAT_TEMPLATES, identical at 42aa63c, e6c3044 and
9ade62d), rendered with the Jinja options transformers' `apply_chat_template` sets. The Think RL recipes
use it."""

from pathlib import Path

import pytest
from jinja2 import Environment
from jinja2.ext import loopcontrols

from olmax.config.recipes import get_recipe
from olmax.data import chat

EOS = "<|endoftext|>"
UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "open_instruct_olmo_thinker.jinja"

# the roles upstream's template knows (system, user, assistant, environment), function declarations
# and calls, a default and a given system prompt, and conversations ending on either side
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "<think>add</think>4"}],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "And goodbye?"},
    ],
    [
        {"role": "system", "content": "", "functions": '[{"name": "add"}]'},
        {"role": "user", "content": "Add 2 and 3", "functions": "[]"},
        {"role": "assistant", "content": None, "function_calls": "add(2, 3)"},
        {"role": "environment", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
    ],
]


def test_think_dpo_rl_renders_as_open_instructs_olmo_thinker():
    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    upstream = env.from_string(UPSTREAM.read_text())
    for messages in CONVERSATIONS:
        for gen in (False, True):
            want = upstream.render(messages=messages, add_generation_prompt=gen, eos_token=EOS)
            assert chat.render("think_dpo_rl", messages, EOS, gen) == want
    # the default system prompt is what differs from the Think SFT template's
    assert chat.render("think_dpo_rl", CONVERSATIONS[0], EOS).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n<|im_start|>user\n"
    )
    assert chat.render("think", CONVERSATIONS[0], EOS) != chat.render("think_dpo_rl", CONVERSATIONS[0], EOS)


@pytest.mark.parametrize("name", ["olmo3_7b_think_rl", "olmo3_32b_think_rl"])
def test_think_rl_recipes_render_prompts_as_ai2s_runs(name):
    assert get_recipe(name).grpo.template == "think_dpo_rl"
