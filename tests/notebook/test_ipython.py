"""rlkit's errors in a real Jupyter kernel: the message without the traceback, the traceback with %xmode verbose."""

from __future__ import annotations

import re

from tests.tutorials.notebooks import run_cells as run_in_kernel

BAD_CONFIG = "rlkit.load_config('quickstart', ['grpo.num_prompts_per_stp=4', 'loss_fn.policy_loss=ppo'])"
CELLS = [
    "import rlkit",
    BAD_CONFIG,
    "def reward(**kw):\n    raise ZeroDivisionError('my bug')\n"
    "try:\n    reward()\nexcept ZeroDivisionError as e:\n    raise rlkit.errors.RewardError('reward failed on every sample') from e",
    "raise ValueError('not an rlkit error')",
    "%xmode verbose",
    BAD_CONFIG,
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_cells(tmp_path) -> list[dict]:
    """Each cell's error output (ename, evalue, traceback text without colours), or None."""
    nb = run_in_kernel(CELLS, tmp_path, allow_errors=True)
    out = []
    for cell in nb.cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        out.append(None if not errors else dict(ename=errors[0].ename, evalue=errors[0].evalue,
                                                 text=ANSI.sub("", "\n".join(errors[0].traceback))))
    return out


def test_rlkit_errors_show_their_message_and_the_traceback_only_with_xmode_verbose(tmp_path):
    _, config, reward, other, _, verbose = run_cells(tmp_path)
    assert config["ename"] == "ConfigError"
    text = config["text"]
    assert "grpo.num_prompts_per_stp: unknown key; did you mean grpo.num_prompts_per_step?" in text
    assert "loss_fn.policy_loss" in text and "ppo_clip" in text  # every problem, with the fix
    assert "loading.py" not in text and "Traceback" not in text and "Cell In[" not in text
    assert "%xmode verbose shows it" in text

    assert reward["ename"] == "RewardError" and "reward failed on every sample" in reward["text"]
    assert "raised from:" in reward["text"] and "ZeroDivisionError: my bug" in reward["text"]

    assert other["ename"] == "ValueError" and "Cell In[" in other["text"]  # other errors: IPython's usual traceback

    assert verbose["ename"] == "ConfigError"
    assert "loading.py" in verbose["text"] and "grpo.num_prompts_per_stp: unknown key" in verbose["text"]
