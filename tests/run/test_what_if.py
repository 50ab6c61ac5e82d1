"""The what-if instruments on a real session (Megatron-Core policy, vLLM generator, nano model): the rollout
history's rings and bounds, replay of a past step (exact against the step's own record, and leaving the live
session bit for bit as it was), compare_losses against each loss computed alone, and forks stepped alternately
against the same branches run one after the other. One session for the module (its start is most of the cost);
the fork tests run last, since they leave the session forked."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlkit
from rlkit.algorithms import LossParams, RLLoss
from rlkit.policy.per_token import evaluate_loss_per_token
from rlkit.rng import capture
from tests.session.conftest import tiny_overrides, varied_reward


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from rlkit.envs import RewardFunctionEnvironment

    s = rlkit.Session.from_config("quickstart", tiny_overrides(
        tmp_path_factory.mktemp("whatif"), **{"history.full_weight_snapshots": True, "history.snapshots": 2,
                                              "history.max_steps": 3}),
        env=RewardFunctionEnvironment(varied_reward))
    for _ in range(4):
        s.step()
    yield s
    s.close()


def live_state(session):
    """Everything replay must not change: weights, optimizer state, schedule, version, run position, RNG."""
    policy = session.policy
    opt = policy.optimizer.state_dict()
    tensors, meta = capture()
    return {"weights": {n: p.detach().clone() for n, p in policy.model.named_parameters()},
            "optimizer": {(k, n): v.clone() for k, s in opt["state"].items() for n, v in s.items()
                          if isinstance(v, torch.Tensor)},
            "groups": repr(opt["param_groups"]), "scheduler": repr(policy.scheduler.state_dict()),
            "version": policy.version, "step": session.step_count, "sampler": repr(session.sampler.state_dict()),
            "rng": {k: v.clone() for k, v in tensors.items()}, "rng_meta": repr(meta),
            "grads": [n for n, p in policy.model.named_parameters() if p.grad is not None]}


def assert_same(before, after):
    assert before.keys() == after.keys()
    for key in before:
        a, b = before[key], after[key]
        if isinstance(a, dict):
            assert a.keys() == b.keys(), key
            assert all(torch.equal(a[k], b[k]) for k in a), key
        else:
            assert a == b, key


def test_the_rings_keep_the_last_steps_within_their_bounds(session):
    store = session.store
    assert list(store.records) == [2, 3, 4] and list(store.snapshots) == [3, 4]
    assert session.history[0].batch is None and session.history[1].batch is store.record(2).batch
    assert session.history[-1].batch is store.record(4).batch
    assert session.weights_at() == {3: "snapshot", 4: "snapshot"} and session.weights_at(2) is None
    record = store.record(4)
    assert record.batch.prev_logprobs is not None and record.batch.advantages is not None
    assert (record.version_before, record.policy_version) == (3, 4)
    with pytest.raises(KeyError, match="history.max_steps"):
        store.record(1)
    with pytest.raises(KeyError, match=r"snapshots kept: \[3, 4\]\); history.snapshots sets how many"):
        session.replay(2)


def test_replay_without_full_weight_snapshots_says_the_key_is_live_and_which_steps_it_reaches():
    """The docs' first replay with full weights and the default history: the message names the live key and says
    the steps already taken stay unreplayable (the steps ran with the key off)."""
    from rlkit.config.loading import load_config
    from rlkit.run.history import RolloutHistory, before_train

    config, store = load_config("quickstart_nano"), RolloutHistory()
    assert not config.history.full_weight_snapshots and not config.policy.lora_cfg.enabled
    for step in range(6):
        before_train(store, None, config, step)
    assert store.unsnapshotted == [3, 4, 5, 6] and not store.snapshots  # as many as history.snapshots
    with pytest.raises(KeyError, match=r"step 5: .*full_weight_snapshots=true, which was off.*session\.configure"):
        store.weights(5)
    with pytest.raises(KeyError, match="snapshots kept: none"):
        store.weights(1)


def test_the_byte_bound_holds(session):
    from rlkit.run.history import RolloutHistory

    records = list(session.store.records.values())
    one = records[0].nbytes
    ring = RolloutHistory()
    for r in records:
        ring.add(r, max_steps=10, max_bytes=2 * one + one // 2)
    assert len(ring.records) == 2 and ring.nbytes <= 2 * one + one // 2
    for r in records:  # give the metrics their batches back (the shared session's ring is the real one)
        session.store.add(r, 3, 2**30)


def test_replaying_a_step_with_its_own_settings_reproduces_its_loss_and_gradient_norm(session):
    for step in (3, 4):
        report = session.replay(step)
        assert abs(report.taken["loss"] - report.recorded["loss"]) <= 1e-6 * max(1, abs(report.recorded["loss"]))
        assert abs(report.taken["grad_norm"] - report.recorded["grad_norm"]) <= 1e-6 * report.recorded["grad_norm"]
        assert report.recorded["grad_norm"] > 0 and report.cosine_to_taken == 1.0
        # the per-token contributions add up to the loss
        assert abs(float(report.values("loss").sum()) - report.metrics["loss"]) <= 1e-6


def test_replay_under_another_loss_leaves_the_live_session_bit_for_bit_unchanged(session):
    before = live_state(session)
    gspo = session.replay(3, loss="gspo")
    cispo = session.replay(4, loss="cispo", estimator="dr_grpo")
    assert_same(before, live_state(session))
    assert "gspo" in gspo.loss_fn and "seq_mean_token_mean" in gspo.loss_fn  # the preset's companions came along
    assert -1 < gspo.cosine_to_taken < 1 and math.isfinite(cispo.grad_norm)
    assert not torch.equal(cispo.batch.advantages, session.store.record(4).batch.advantages)
    table = gspo.table()
    assert len(table) == int(gspo.batch.loss_mask.sum()) and {"loss", "ratio", "clipped", "advantage"} <= set(table)
    # the replayed gradient is the one the step's weights give: compare with a plain loss at those weights
    from rlkit.policy.snapshots import weights_swapped_in

    with weights_swapped_in(session.policy, session.store.weights(3)):
        alone = session.policy.evaluate_loss(gspo.batch, RLLoss(LossParams(policy_loss="gspo",
                                                                           **_gspo_companions(session))))
    assert abs(alone["loss"] - gspo.metrics["loss"]) <= 1e-6


def _gspo_companions(session):
    return session._companions("gspo")


def test_compare_losses_per_token_equals_each_loss_alone(session):
    batch = session.batch
    comparison = session.compare_losses(batch)
    assert list(comparison.losses) == ["ppo_clip", "gspo", "cispo"]
    for name in comparison.losses:
        fn = RLLoss(LossParams(policy_loss=name, **session._companions(name)))
        alone = evaluate_loss_per_token(session.policy, batch, fn)
        for quantity, values in alone.values.items():
            assert torch.allclose(comparison.values(name, quantity), values, atol=1e-6, rtol=0), (name, quantity)
        whole = session.policy.evaluate_loss(batch, fn)  # the microbatched loss of the backend
        assert abs(whole["loss"] - float(comparison.values(name).sum())) <= 1e-6
        assert abs(whole["loss"] - comparison.losses[name].metrics["loss"]) <= 1e-6
    cos = comparison.cosine_matrix()
    assert cos.shape == (3, 3) and all(-1 <= c <= 1 for c in comparison.cosines.values())
    assert set(comparison.table()["loss_fn"]) == {"ppo_clip", "gspo", "cispo"}


def test_a_recording_session_stores_its_batches_on_disk(session, tmp_path):
    folder = session.log_to(run_dir=tmp_path / "run")
    try:
        session.step()
    finally:
        session.stop_logging()
    step = session.step_count
    back = rlkit.open_run(folder).batch(step)
    kept = session.store.record(step).batch
    for name in ("input_ids", "loss_mask", "advantages", "prev_logprobs", "generator_logprobs", "rewards"):
        assert torch.equal(getattr(back, name), getattr(kept, name)), name


def test_weights_at_lists_snapshots_and_periodic_checkpoints(session):
    from pathlib import Path

    from rlkit.tracking.checkpoint import save_periodic

    cfg = session.config
    path = save_periodic(session.save, Path(cfg.logger.log_dir) / cfg.name / "checkpoints", session.step_count, 1)
    found = session.weights_at()
    assert found[session.step_count + 1] == str(path)  # the weights the next step starts from
    assert [s for s, where in found.items() if where == "snapshot"] == list(session.store.snapshots)
    assert session.weights_at(1) is None


def _comparable(history):
    """A branch's step records without wall-clock figures (timing/ differs from run to run)."""
    return [(m.step, m.policy_version, {k: v for k, v in m.values.items() if not k.startswith("timing/")})
            for m in history]


def test_forks_stepped_alternately_match_the_same_branches_run_one_after_the_other(session):
    if session.stale:
        session.refit()
    start = session.step_count
    a, b, b_again = session.fork(3)
    assert [n for n in session.branches] == ["main", "a", "b", "c"] and session.branches["main"].active
    b.configure({"grpo.advantage_estimator": "dr_grpo", "loss_fn.aggregation": "seq_sum_constant",
                 "loss_fn.seq_sum_constant": 8})
    b_again.configure({"grpo.advantage_estimator": "dr_grpo", "loss_fn.aggregation": "seq_sum_constant",
                       "loss_fn.seq_sum_constant": 8})
    for _ in range(2):  # a and b alternately: every step swaps the other branch out and refits the engine
        a.step()
        b.step()
    assert a.step_count == b.step_count == start + 2 and b.config.grpo.advantage_estimator == "dr_grpo"
    # the same branches one after the other: main (a's settings, from the fork's state), then b's twin
    session.branches["main"].activate()
    assert session.step_count == start and session.config.grpo.advantage_estimator == "grpo"
    session.step()
    session.step()
    b_again.step()
    b_again.step()
    assert _comparable(a.history[start:]) == _comparable(session.branches["main"].history[start:])
    assert _comparable(b.history[start:]) == _comparable(b_again.history[start:])
    assert _comparable(a.history[start:]) != _comparable(b.history[start:])  # the two settings do differ
    assert len(b.swap_seconds) >= 2 and max(a.swap_seconds + b.swap_seconds) < 5  # each activation timed
    print(f"fork swap: {min(a.swap_seconds) * 1e3:.1f}..{max(a.swap_seconds) * 1e3:.1f} ms; parked branch {a.nbytes / 2**20:.2f} MiB")
    assert a.nbytes > 0 and session.branches["main"].nbytes > 0  # parked copies: weights and optimizer moments


# one separate session per process (a vLLM engine per process): loaded from the fork point's checkpoint, stepped
SEPARATE_SESSION = """
import json, sys
import rlkit
from rlkit.envs import RewardFunctionEnvironment
from tests.session.conftest import varied_reward
path, overrides, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
with rlkit.Session.load(path, env=RewardFunctionEnvironment(varied_reward), overrides=overrides) as s:
    rows = [s.step() for _ in range(steps)]
    print("METRICS " + json.dumps([[m.step, m.policy_version, {k: v for k, v in m.values.items()
                                                               if not k.startswith("timing/")}] for m in rows]))
"""


# Slow target (~20-50 s): its sibling above (the same branches run one after the other) stays in the default suite
@pytest.mark.slow
def test_forks_stepped_alternately_match_two_separate_sessions_from_the_same_state(session, tmp_path):
    """The acceptance of issue 32 as worded: two forks stepped alternately (one engine, swapped and refit at every
    step) against two separate sessions, each its own process, started from a checkpoint of the fork point and
    run one after the other. Bitwise: the metrics are compared as their JSON text (repr of every float)."""
    session.branches["main"].activate()
    if session.stale:
        session.refit()
    start, point = session.step_count, session.save(tmp_path / "fork_point")
    b_settings = {"grpo.advantage_estimator": "dr_grpo", "loss_fn.aggregation": "seq_sum_constant",
                  "loss_fn.seq_sum_constant": 8}
    a, b = session.fork(2)
    b.configure(b_settings)
    for _ in range(2):
        a.step()
        b.step()
    forked = {name: json.dumps([[m.step, m.policy_version, {k: v for k, v in m.values.items()
                                                             if not k.startswith("timing/")}]
                                for m in branch.history[start:]])
              for name, branch in (("a", a), ("b", b))}
    root = Path(__file__).resolve().parents[2]
    for name, overrides in (("a", {}), ("b", b_settings)):
        done = subprocess.run([sys.executable, "-c", SEPARATE_SESSION, str(point), json.dumps(overrides), "2"],
                              cwd=root, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        separate = next(line for line in done.stdout.splitlines() if line.startswith("METRICS "))[len("METRICS "):]
        assert separate == forked[name], name
    assert forked["a"] != forked["b"]  # the two settings do differ


def test_branches_compare_on_held_out_prompts_and_can_be_dropped(session, tmp_path):
    branches = session.branches
    active = next(n for n, br in branches.items() if br.active)
    table = session.compare_branches(num_prompts=4)
    assert list(table.index) == list(branches) and table["accuracy"].between(0, 1).all()
    assert session.branches[active].active  # the branch active before is active again
    c = session.branches["c"]
    path = c.save(tmp_path / "c")
    assert path.exists() and c.active
    with pytest.raises(ValueError, match="active"):
        c.drop()
    session.branches["main"].activate()
    c.drop()
    assert "c" not in session.branches


def test_a_branch_rollout_after_a_swap_samples_its_own_weights(session):
    """A branch's rollout() after another branch held the engine (compare_branches) refits first, as its run() and
    evaluate() do, instead of sampling the other branch's weights with a 'version -1' warning."""
    import warnings

    session.compare_branches(num_prompts=2)  # every branch evaluated: the engine last held the active one's, swapped
    other = next(br for name, br in session.branches.items() if not br.active)
    other.activate()
    assert session.generator_version == -1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no off-policy warning
        batch = other.rollout()
    assert batch.policy_version == session.policy.version == session.generator_version
