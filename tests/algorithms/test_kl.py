"""KL estimators (Schulman 2020) with log_ratio = ref - logp, hand-derived values and gradients."""

import pytest
import torch

from rlkit.algorithms import kl_penalty

# log_ratio = ref - logp = (-0.5, 1.0)
LOGP = [[-1.0, -2.0]]
REF = [[-1.5, -1.0]]


@pytest.mark.parametrize(
    "name, value, grad",
    [
        # k1 = -lr = (0.5, -1); d/dlogp = +1
        ("k1", [0.5, -1.0], [1.0, 1.0]),
        # k2 = lr^2 / 2 = (0.125, 0.5); d/dlogp = -lr = (0.5, -1)
        ("k2", [0.125, 0.5], [0.5, -1.0]),
        # k3 = e^lr - 1 - lr = (0.606531 - 0.5, 2.718282 - 2); d/dlogp = 1 - e^lr = (0.393469, -1.718282)
        ("k3", [0.106531, 0.718282], [0.393469, -1.718282]),
    ],
)
def test_estimator_values_and_gradients(name, value, grad):
    logp = torch.tensor(LOGP, requires_grad=True)
    kl = kl_penalty(logp, torch.tensor(REF), name)
    torch.testing.assert_close(kl, torch.tensor([value]), atol=1e-5, rtol=0)
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([grad]), atol=1e-5, rtol=0)


def test_clamp_applies_to_log_ratio_and_to_result():
    logp = torch.tensor(LOGP)
    # input clamp: lr (-0.5, 1.0) -> (-0.5, 0.6); k3(0.6) = 1.822119 - 1.6 = 0.222119 (< 0.6, output untouched)
    kl = kl_penalty(logp, torch.tensor(REF), "k3", kl_clamp=0.6)
    torch.testing.assert_close(kl, torch.tensor([[0.106531, 0.222119]]), atol=1e-5, rtol=0)
    # output clamp: lr = 1.5 stays (clamp 1.5), k3(1.5) = 4.481689 - 2.5 = 1.981689 -> clamped to 1.5
    kl = kl_penalty(torch.tensor([[0.0]]), torch.tensor([[1.5]]), "k3", kl_clamp=1.5)
    torch.testing.assert_close(kl, torch.tensor([[1.5]]))
    # k1 with lr = -3 clamped to -2 -> k1 = 2
    kl = kl_penalty(torch.tensor([[0.0]]), torch.tensor([[-3.0]]), "k1", kl_clamp=2.0)
    torch.testing.assert_close(kl, torch.tensor([[2.0]]))


def test_zero_when_policies_agree():
    logp = torch.tensor([[-0.3, -4.0]])
    for name in ("k1", "k2", "k3"):
        assert torch.equal(kl_penalty(logp, logp.clone(), name), torch.zeros(1, 2))


def test_unknown_estimator_lists_names():
    with pytest.raises(ValueError, match="'k1', 'k2', 'k3'"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
