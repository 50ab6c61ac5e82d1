"""The training backend is chosen by one key per backend, ``policy.<name>_cfg.enabled`` (exactly one enabled),
read in one place (``PolicyConfig.backend``); each backend's section holds its own rules and words."""

import pytest

from rlkit.config.components import PolicyConfig
from rlkit.config.loading import load_config
from rlkit.errors import ConfigError
from rlkit.startup import policy_engine

HF = {"policy.hf_cfg.enabled": True, "policy.megatron_cfg.enabled": False}


def base(tmp_path, **extra):
    return {"policy.model_name": str(tmp_path / "m"), "policy.model_preset": "nano", **extra}


def test_the_transformers_backend_key_validates_and_is_the_one_built(tmp_path):
    config = load_config("quickstart_nano", base(tmp_path, **HF))
    assert config.policy.backend is config.policy.hf_cfg and config.policy.backend.name == "hf"
    assert policy_engine(config) == "transformers, one process"
    assert config.policy.backend.layout_words(1) == "one process, no sharding"


def test_the_default_and_nemo_rl_keys_still_choose_megatron_and_dtensor(tmp_path):
    megatron = load_config("quickstart_nano", base(tmp_path)).policy
    assert megatron.backend.name == "megatron" and megatron.backend.layout_words(1) == "TP=1 PP=1 CP=1 EP=1 DP=1"
    dtensor = load_config("quickstart_nano", base(tmp_path, **{"policy.dtensor_cfg.enabled": True,
                                                                "policy.megatron_cfg.enabled": False})).policy
    assert dtensor.backend.name == "dtensor" and dtensor.backend.title == "DTensor (FSDP2)"


@pytest.mark.parametrize("enabled", [{"policy.hf_cfg.enabled": True},
                                     {"policy.megatron_cfg.enabled": False},
                                     {"policy.hf_cfg.enabled": True, "policy.dtensor_cfg.enabled": True}])
def test_exactly_one_backend_is_enabled(tmp_path, enabled):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart_nano", base(tmp_path, **enabled))
    assert ("policy.megatron_cfg.enabled / policy.dtensor_cfg.enabled / policy.hf_cfg.enabled: enable exactly one "
            "training backend") in str(info.value)


def test_the_transformers_backend_states_what_it_cannot_run(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart_nano", base(tmp_path, **HF, **{"policy.num_workers": 2, "policy.precision": "bfloat16",
                                                               "policy.train_global_batch_size": 2}))
    message = str(info.value)
    assert "policy.num_workers=2: the transformers backend (policy.hf_cfg) runs one rank" in message
    assert "policy.precision=bfloat16: the transformers backend (policy.hf_cfg) trains in float32 only" in message
    with pytest.raises(ConfigError, match=r"policy.hf_cfg.enabled: .* is a Mixture-of-Experts model"):
        load_config("quickstart_nano", base(tmp_path, **HF, **{"policy.model_preset": "nano-moe",
                                                               "policy.model_family": "mixtral"}))


def test_data_parallel_size_is_the_backends_rule():
    megatron = PolicyConfig(model_name="m", num_workers=8, megatron_cfg={"tensor_model_parallel_size": 2,
                                                                         "pipeline_model_parallel_size": 2})
    assert megatron.backend.data_parallel_size(8) == 2 and megatron.backend.pipelined()
    dtensor = PolicyConfig(model_name="m", dtensor_cfg={"enabled": True}, megatron_cfg={"enabled": False})
    assert dtensor.backend.data_parallel_size(8) == 8 and not dtensor.backend.pipelined()
