"""The table of what a config change needs: longest prefix wins, every prefix names a real key, and the
dotted keys that differ between two configs are each classified."""

import pytest

from rlkit.config.changes import CHANGES, Change, change_for, changes_needed, refusals
from rlkit.config.loading import load_config
from rlkit.config.run import RunConfig


def leaf_keys(tree, prefix=""):
    if not isinstance(tree, dict):
        return [prefix]
    return [k for key, value in tree.items() for k in leaf_keys(value, f"{prefix}.{key}" if prefix else key)]


@pytest.mark.parametrize("key, change", [
    ("name", Change.LIVE), ("grpo.val_period", Change.LIVE), ("grpo.advantage_estimator", Change.LIVE),
    ("sft.num_steps", Change.LIVE), ("eval.num_prompts", Change.LIVE),
    ("grpo.num_prompts_per_step", Change.ROLLOUTS), ("grpo.use_dynamic_sampling", Change.ROLLOUTS),
    ("loss_fn.ratio_clip_max", Change.LOSS), ("grpo.reward_kl_coef", Change.LOSS),
    ("policy.optimizer.lr", Change.OPTIMIZER), ("policy.scheduler.warmup_steps", Change.OPTIMIZER),
    ("seed", Change.RUN),
    ("grpo.async_grpo.enabled", Change.SESSION), ("policy.generation.temperature", Change.SESSION),
    ("policy.train_micro_batch_size", Change.SESSION), ("data.num_train", Change.SESSION),
    ("env.name", Change.SESSION), ("a_section_added_later.x", Change.SESSION),
])
def test_the_longest_matching_prefix_decides(key, change):
    assert change_for(key) is change


def test_every_prefix_in_the_table_names_a_config_key():
    """A typo in the table would silently leave a key at the default (a new session)."""
    keys = leaf_keys(RunConfig().model_dump(mode="json"))
    for prefix, _ in CHANGES:
        assert any(k == prefix or k.startswith(prefix + ".") for k in keys), prefix
    assert len({prefix for prefix, _ in CHANGES}) == len(CHANGES)  # each prefix once


def test_changes_needed_lists_each_changed_leaf_key():
    old = load_config("quickstart")
    new = load_config("quickstart", ["grpo.num_prompts_per_step=3", "loss_fn.ratio_clip_max=0.3", "seed=2",
                                     "policy.optimizer.lr=1e-3", "policy.generation.temperature=0.5",
                                     "grpo.max_num_steps=7"])
    assert changes_needed(old, new) == {
        "grpo.num_prompts_per_step": Change.ROLLOUTS, "loss_fn.ratio_clip_max": Change.LOSS, "seed": Change.RUN,
        "policy.optimizer.lr": Change.OPTIMIZER, "policy.generation.temperature": Change.SESSION,
        "grpo.max_num_steps": Change.LIVE}
    assert changes_needed(old, load_config("quickstart")) == {}
    problems = refusals(changes_needed(old, new), {Change.LIVE, Change.LOSS}, "configure()")
    assert len(problems) == 4  # rollouts, optimizer, run, session: each named with what it needs
    assert "policy.generation.temperature: changing it needs a new Session (Session.from_config(" in "\n".join(problems)
