"""DPO and reward-model training hold a second model beside the policy; each is refused before it loads anything when
the run's memory plan with that model (rlkit.memory.offline.plan_offline_stage) does not fit the device, as a session
is at its start. The device is made just too small for the stage and large enough for the RL run itself."""

import pytest

import rlkit
from rlkit.memory import plan as plan_module
from rlkit.memory.offline import plan_offline_stage
from rlkit.memory.plan import Device, MemoryPlanError, plan_memory


def squeeze_between(monkeypatch, fits, refused) -> None:
    """This machine's device, as the plans see it, with room for ``fits`` and not for ``refused``."""
    assert refused.total > fits.total
    device = Device("cpu", (fits.total + refused.total) // 2, "a test device between the two plans")
    monkeypatch.setattr(plan_module, "this_device", lambda config: device)


def test_dpo_and_a_reward_model_are_refused_before_loading_when_their_plan_does_not_fit(tmp_path, monkeypatch):
    overrides = {"policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"),
                 "loss_fn.reference_policy_kl_penalty": 0.0}  # the RL loss holds no reference: DPO adds one
    with rlkit.Session.from_config("quickstart_nano", overrides) as s:
        rl = plan_memory(s.config)
        dpo = plan_offline_stage(s.config, "dpo")
        assert rl.parts.get("reference", 0) == 0 and dpo.parts["reference"] > 0

        squeeze_between(monkeypatch, rl, dpo)
        assert plan_memory(s.config).fits  # the run itself still fits
        with pytest.raises(MemoryPlanError) as refused:
            s.dpo(1, progress=False)
        assert "DPO's reference" in str(refused.value) and "RLKIT_SKIP_MEMORY_PLAN=1" in str(refused.value)
        assert s.run_state.preference is None and s.last_dpo is None  # nothing started

        reward_model = plan_offline_stage(s.config, "reward_model")
        squeeze_between(monkeypatch, rl, reward_model)
        output = tmp_path / "rm"
        with pytest.raises(MemoryPlanError, match="reward model"):
            s.train_reward_model(output, progress=False)
        assert not output.exists()

        monkeypatch.setenv(plan_module.SKIP_ENV, "1")  # the user's override starts it anyway
        assert s.dpo(1, progress=False).steps
