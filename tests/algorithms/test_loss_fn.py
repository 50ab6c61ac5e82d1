"""RLLoss: hand-derived total and metrics, microbatch equivalence, reference handling, params checks."""

import math

import pytest
import torch

from rlkit.algorithms import POLICY_LOSSES, LossParams, RLLoss, count_valid
from rlkit.errors import ConfigError, StageOrderError

F64 = torch.float64


def test_hand_derived_loss_gradient_and_metrics(make_batch):
    # on-policy (prev_logprobs None -> ratio 1), ppo_clip, token_mean over 3 valid tokens, beta 0.1 with k1
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64)
    gen = torch.tensor([[-1.1, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64)
    entropy = torch.tensor([[0.5, 1.5, 9.0], [1.0, 9.0, 9.0]], dtype=F64)
    batch = make_batch(mask, adv, gen, ref_logprobs=ref, entropy=entropy)
    loss_fn = RLLoss(LossParams(reference_policy_kl_penalty=0.1, kl_estimator="k1"))
    loss, m = loss_fn(logprobs, batch, count_valid(mask))
    # pg per token -A * 1 = (-1, -1 | 2) -> sum 0 -> pg_loss 0
    # k1 = logp - ref = (0.5, -1 | 0) -> sum -0.5 -> kl -1/6, kl_penalty 0.1 * -1/6
    assert loss.item() == pytest.approx(-1 / 60)
    assert m["pg_loss"].item() == pytest.approx(0.0) and m["kl_penalty"].item() == pytest.approx(-1 / 60)
    assert m["kl"].item() == pytest.approx(-1 / 6)
    loss.backward()
    # d/dlogp: (-A + 0.1) / 3 -> (-0.3, -0.3 | 0.7)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.3, -0.3, 0.0], [0.7, 0.0, 0.0]], dtype=F64))
    assert m["probs_ratio"].item() == pytest.approx(1.0) and m["clipped_fraction"].item() == 0.0
    assert m["approx_entropy"].item() == pytest.approx(1.0)  # (0.5 + 1.5 + 1.0) / 3
    # |prev - gen| = (0.1, 0 | 0) -> (e^0.1 + 1 + 1) / 3
    assert m["token_mult_prob_error"].item() == pytest.approx((math.exp(0.1) + 2) / 3)
    assert m["is_weight_mean"].item() == pytest.approx(1.0)
    for name, value in m.items():
        assert value.ndim == 0 and not value.requires_grad, name


def test_tis_weight_multiplies_the_policy_loss_only(make_batch):
    # prev - gen = 0.5 -> rho = 1.648721, capped at 1.2; on-policy ratio 1; A = 1 -> pg = -1.2
    mask = torch.ones(1, 1, dtype=torch.bool)
    logprobs = torch.tensor([[-1.0]], dtype=F64, requires_grad=True)
    batch = make_batch(mask, torch.ones(1, 1, dtype=F64), torch.tensor([[-1.5]], dtype=F64),
                       prev_logprobs=torch.tensor([[-1.0]], dtype=F64))
    loss, m = RLLoss(LossParams(off_policy_correction="tis", tis_cap=1.2))(logprobs, batch, count_valid(mask))
    assert loss.item() == pytest.approx(-1.2)
    assert m["is_weight_mean"].item() == pytest.approx(1.2) and m["is_clipped_fraction"].item() == 1.0
    assert m["token_mult_prob_error"].item() == pytest.approx(math.exp(0.5))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_gradient_stays_finite_where_the_reference_is_zero_outside_the_completion(make_batch, estimator):
    """The logprobs stage leaves 0 outside the completion; the policy's logprob of a prompt token can be
    far below -88, where k3's exp(ref - logp) overflows float32 and a masked inf gives NaN gradients."""
    mask = torch.tensor([[False, True, True]])
    logprobs = torch.tensor([[-200.0, -1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1.5, -1.0]])  # 0 on the prompt position, as the logprobs stage leaves it
    batch = make_batch(mask, torch.ones(1, 3), torch.tensor([[0.0, -1.0, -2.0]]), ref_logprobs=ref)
    loss, m = RLLoss(LossParams(reference_policy_kl_penalty=0.1, kl_estimator=estimator))(logprobs, batch, count_valid(mask))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(m["kl"]) and torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[0, 0] == 0.0  # the prompt position gets no gradient

def random_batch(make_batch, seed=0, b=8, t=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 0, 5, 1, 6, 2, 4])  # row 2 fully masked
    mask = torch.arange(t)[None, :] < lengths[:, None]
    gen = -torch.rand(b, t, generator=g, dtype=F64) * 3
    prev = gen + 0.05 * torch.randn(b, t, generator=g, dtype=F64)
    ref = prev + 0.2 * torch.randn(b, t, generator=g, dtype=F64)
    logprobs = prev + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, 1, generator=g, dtype=F64).expand(b, t) * mask
    entropy = torch.rand(b, t, generator=g, dtype=F64)
    batch = make_batch(mask, adv, gen, group_size=2, prev_logprobs=prev, ref_logprobs=ref, entropy=entropy)
    return logprobs, batch


CONFIGS = {  # each with a metric that must be nonzero, so the test exercises that branch
    "ppo_tis_kl": (
        LossParams(reference_policy_kl_penalty=0.05, off_policy_correction="tis", tis_cap=1.02, ratio_clip_c=2.0),
        ("clipped_fraction", "is_clipped_fraction", "kl_penalty"),
    ),
    "gspo_seq_mean": (
        LossParams(policy_loss="gspo", aggregation="seq_mean_token_mean", ratio_clip_min=0.05,
                   ratio_clip_max=0.05, reference_policy_kl_penalty=0.1, kl_estimator="k2"),
        ("clipped_fraction", "kl_penalty"),
    ),
    "cispo_dr_seq_mask": (
        LossParams(policy_loss="cispo", aggregation="seq_sum_constant", seq_sum_constant=7, cispo_clip_max=0.1,
                   off_policy_correction="seq_mask", seq_mask_low=0.98, seq_mask_high=1.02),
        ("clipped_fraction", "is_clipped_fraction"),
    ),
    "reinforce_kl_clamp": (
        LossParams(policy_loss="reinforce", reference_policy_kl_penalty=0.01, kl_clamp=0.3),
        ("kl_penalty",),
    ),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_microbatches_sum_to_the_whole_batch(config, make_batch):
    params, active = config
    logprobs, batch = random_batch(make_batch)
    loss_fn = RLLoss(params)
    counts = count_valid(batch.loss_mask)

    def run(num_micro):
        lp = logprobs.clone().requires_grad_(True)
        total, summed = 0.0, {}
        size = batch.batch_size // num_micro
        for i in range(num_micro):
            rows = slice(i * size, (i + 1) * size)
            loss, metrics = loss_fn(lp[rows], batch.select(rows), counts)
            loss.backward()
            total += loss.item()
            for k, v in metrics.items():
                summed[k] = summed.get(k, 0.0) + v.item()
        return total, lp.grad, summed

    whole_loss, whole_grad, whole_metrics = run(1)
    assert whole_grad.abs().sum() > 0 and all(whole_metrics[k] != 0 for k in active)
    assert (whole_grad[~batch.loss_mask] == 0).all()
    for n in (2, 4):
        loss, grad, metrics = run(n)
        assert loss == pytest.approx(whole_loss, abs=1e-6)
        torch.testing.assert_close(grad, whole_grad, atol=1e-6, rtol=0)
        assert metrics.keys() == whole_metrics.keys()
        for k in metrics:
            assert metrics[k] == pytest.approx(whole_metrics[k], abs=1e-6), k


def test_needs_reference():
    assert not RLLoss().needs_reference
    assert RLLoss(LossParams(reference_policy_kl_penalty=0.01)).needs_reference
    assert RLLoss(kl_in_reward=True).needs_reference


def test_missing_reference_and_missing_advantages_are_guard_errors(make_batch):
    logprobs, batch = random_batch(make_batch)
    counts = count_valid(batch.loss_mask)
    with pytest.raises(StageOrderError, match="ref_logprobs"):
        RLLoss(LossParams(reference_policy_kl_penalty=0.1))(logprobs, batch.with_(ref_logprobs=None), counts)
    with pytest.raises(StageOrderError, match="advantages"):
        RLLoss()(logprobs, batch.with_(advantages=None), counts)
    # without a KL term the reference is optional: the kl metric reads 0 without it, k3 >= 0 with it
    _, m = RLLoss()(logprobs, batch.with_(ref_logprobs=None), counts)
    assert m["kl"].item() == 0.0
    loss, m = RLLoss()(logprobs.requires_grad_(True), batch, counts)
    assert m["kl"].item() > 0 and m["kl_penalty"].item() == 0.0


def test_on_policy_when_prev_logprobs_missing(make_batch):
    # prev None -> old = logprobs.detach(): ratio 1 everywhere, nothing clipped
    logprobs, batch = random_batch(make_batch)
    _, m = RLLoss(LossParams(ratio_clip_min=0.0, ratio_clip_max=0.0))(
        logprobs, batch.with_(prev_logprobs=None), count_valid(batch.loss_mask)
    )
    assert m["probs_ratio"].item() == pytest.approx(1.0) and m["clipped_fraction"].item() == 0.0


def test_policy_loss_may_be_a_callable(make_batch):
    calls = []

    def my_loss(logprobs, old, adv, mask, params):
        calls.append(params.ratio_clip_max)
        return POLICY_LOSSES.get("reinforce")(logprobs, old, adv, mask, params)

    logprobs, batch = random_batch(make_batch)
    counts = count_valid(batch.loss_mask)
    loss, _ = RLLoss(LossParams(policy_loss=my_loss, ratio_clip_max=0.3))(logprobs, batch, counts)
    ref, _ = RLLoss(LossParams(policy_loss="reinforce"))(logprobs, batch, counts)
    assert calls == [0.3] and loss.item() == pytest.approx(ref.item())
    assert "my_loss" in repr(RLLoss(LossParams(policy_loss=my_loss)))


def test_params_report_every_problem_at_once():
    with pytest.raises(ConfigError) as err:
        LossParams(policy_loss="ppo", kl_estimator="k5", ratio_clip_c=0.5, aggregation="seq_sum_constant", tis_cap=0)
    problems = err.value.problems
    assert len(problems) == 5
    assert any("policy_loss" in p and "'ppo_clip', 'gspo', 'cispo', 'reinforce'" in p for p in problems)
    assert any("kl_estimator" in p and "'k1', 'k2', 'k3'" in p for p in problems)
    assert any(p.startswith("ratio_clip_c=0.5") for p in problems)
    assert any(p.startswith("seq_sum_constant=None") for p in problems)
    assert any(p.startswith("tis_cap=0") for p in problems)
    assert LossParams().problems() == []
