"""The training backend is chosen by one key, ``policy.backend``; NeMo-RL's ``policy.<name>_cfg.enabled`` flags
still load as a read-only way to say the same, and flags that disagree with it are refused by name. Each backend's
section holds its own rules, words and memory facts, so nothing outside a backend's module and the registries
branches on a backend's or an engine's name."""

import re
from pathlib import Path
from typing import get_args

import pytest
import yaml

from rlkit.config.backends import BackendName, BackendSection, DTensorConfig, MegatronConfig
from rlkit.config.components import PolicyConfig
from rlkit.config.engines import ENGINES
from rlkit.config.loading import config_to_yaml, load_config
from rlkit.memory.plan import GIB, Device, plan_memory
from rlkit.errors import ConfigError
from rlkit.startup import generator_engine, policy_engine

import rlkit

BACKENDS = get_args(BackendName)
NEMO_RL_DTENSOR = {"policy.dtensor_cfg.enabled": True, "policy.megatron_cfg.enabled": False}


def base(tmp_path, **extra):
    return {"policy.model_name": str(tmp_path / "m"), "policy.model_preset": "nano", **extra}


def test_one_key_switches_the_backend(tmp_path):
    hf = load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "hf"})).policy
    assert hf.backend == "hf" and hf.backend_section is hf.hf_cfg
    assert hf.backend_section.layout_words(1) == "one process, no sharding"
    dtensor = load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "dtensor"})).policy
    assert dtensor.backend == "dtensor" and dtensor.backend_section.title == "DTensor (FSDP2)"
    megatron = load_config("quickstart_nano", base(tmp_path)).policy
    assert megatron.backend == "megatron" and megatron.backend_section.layout_words(1) == "TP=1 PP=1 CP=1 EP=1 DP=1"
    assert policy_engine(load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "hf"}))) == \
        "transformers, one process"


def test_the_nemo_rl_flags_load_as_the_same_config(tmp_path):
    one_key = load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "dtensor"}))
    nemo_rl = load_config("quickstart_nano", base(tmp_path, **NEMO_RL_DTENSOR))
    assert nemo_rl == one_key and nemo_rl.policy.backend == "dtensor"
    assert nemo_rl.policy.dtensor_cfg.enabled is None and nemo_rl.policy.megatron_cfg.enabled is None  # read, cleared
    # the one true flag alone names the backend; with policy.backend said too, agreeing flags are fine
    assert load_config("quickstart_nano", base(tmp_path, **{"policy.dtensor_cfg.enabled": True})) == one_key
    agreeing = load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "dtensor"}, **NEMO_RL_DTENSOR))
    assert agreeing == one_key
    as_section = PolicyConfig(model_name="m", dtensor_cfg=DTensorConfig(enabled=True),
                              megatron_cfg=MegatronConfig(enabled=False))
    assert as_section == PolicyConfig(model_name="m", backend="dtensor")


def test_a_recorded_config_switches_with_one_override(tmp_path):
    """A run's resolved config holds policy.backend and no flags, so a rebuild from it can switch."""
    nemo_rl = load_config("quickstart_nano", base(tmp_path, **NEMO_RL_DTENSOR))
    recorded = yaml.safe_load(config_to_yaml(nemo_rl))["policy"]
    assert recorded["backend"] == "dtensor" and not any("enabled" in recorded[f"{name}_cfg"] for name in BACKENDS)
    assert load_config(nemo_rl.model_dump(mode="json"), {"policy.backend": "hf"}).policy.backend == "hf"


@pytest.mark.parametrize("overrides, keys", [
    ({"policy.backend": "megatron", "policy.dtensor_cfg.enabled": True},
     ["policy.backend=megatron", "policy.dtensor_cfg.enabled=true"]),
    ({"policy.backend": "dtensor", "policy.dtensor_cfg.enabled": False},
     ["policy.backend=dtensor", "policy.dtensor_cfg.enabled=false"]),
    ({"policy.megatron_cfg.enabled": False},
     ["policy.backend=megatron (the default)", "policy.megatron_cfg.enabled=false"]),
    ({"policy.hf_cfg.enabled": True, "policy.dtensor_cfg.enabled": True},
     ["policy.dtensor_cfg.enabled=true", "policy.hf_cfg.enabled=true"]),
])
def test_flags_that_disagree_with_the_backend_are_refused_by_name(tmp_path, overrides, keys):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart_nano", base(tmp_path, **overrides))
    [problem] = [p for p in info.value.problems if "choose different training backends" in p]
    assert all(key in problem for key in keys), problem
    assert "Fix: set policy.backend alone (megatron | dtensor | hf) and drop the enabled flags" in problem


def test_a_model_copy_that_sets_flags_is_refused_before_a_policy_is_built():
    """model_copy does not validate: flags set that way would build the old backend without a word."""
    from rlkit.policy.backends import in_process_policy

    stale = PolicyConfig(model_name="m").model_copy(update={"dtensor_cfg": DTensorConfig(enabled=True)})
    assert stale.backend == "megatron" and stale.backend_problems()
    with pytest.raises(ConfigError, match="policy.backend=megatron .*policy.dtensor_cfg.enabled=true"):
        in_process_policy(stale)


def test_the_transformers_backend_states_what_it_cannot_run(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "hf", "policy.num_workers": 2,
                                                         "policy.precision": "bfloat16",
                                                         "policy.train_global_batch_size": 2}))
    message = str(info.value)
    assert "policy.num_workers=2: the transformers backend (policy.backend=hf) runs one rank" in message
    assert "policy.precision=bfloat16: the transformers backend (policy.backend=hf) trains in float32 only" in message
    with pytest.raises(ConfigError, match=r"policy.backend=hf: .* is a Mixture-of-Experts model"):
        load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "hf", "policy.model_preset": "nano-moe",
                                                         "policy.model_family": "mixtral"}))


def test_data_parallel_size_is_the_backends_rule():
    megatron = PolicyConfig(model_name="m", num_workers=8, megatron_cfg={"tensor_model_parallel_size": 2,
                                                                         "pipeline_model_parallel_size": 2})
    assert megatron.backend_section.data_parallel_size(8) == 2 and megatron.backend_section.pipelined()
    dtensor = PolicyConfig(model_name="m", backend="dtensor")
    assert dtensor.backend_section.data_parallel_size(8) == 8 and not dtensor.backend_section.pipelined()


def test_the_names_come_from_the_registries():
    from rlkit.generation.engines import ENGINES as BUILT_ENGINES
    from rlkit.policy.backends import BACKENDS

    assert get_args(BackendName) == tuple(PolicyConfig(model_name="m").backends()) == tuple(BACKENDS)
    assert get_args(PolicyConfig.model_fields["generation"].annotation.model_fields["backend"].annotation) == \
        tuple(ENGINES) == tuple(BUILT_ENGINES)


def test_the_engine_words_and_facts_come_from_its_record(tmp_path):
    hf = load_config("quickstart_nano", base(tmp_path, **{"policy.generation.backend": "hf"}))
    assert generator_engine(hf) == "transformers generate, in this process"
    vllm = load_config("quickstart_nano", base(tmp_path))
    assert generator_engine(vllm) == "vLLM, in this process"
    with pytest.raises(ConfigError, match="policy.generation.colocated.enabled=false: runs the engine in a Ray actor"):
        load_config("quickstart_nano", base(tmp_path, **{"policy.generation.backend": "hf",
                                                         "policy.generation.colocated.enabled": False}))


class PlainSection(BackendSection):
    """A new backend that states nothing beyond its words: the memory plan takes the section's defaults."""

    name, title, start_words = "plain", "plain PyTorch", "plain PyTorch"

    def layout_words(self, num_workers: int) -> str:
        return "one process"


class PlainPolicyConfig(PolicyConfig):
    plain_cfg: PlainSection = PlainSection()


def test_a_new_backend_does_not_crash_the_memory_plan(tmp_path):
    hf_model = dict(model_type="llama", vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=128)
    cpu = Device("cpu", 100 * GIB, "test CPU")
    config = load_config("quickstart_nano", base(tmp_path, **{"policy.backend": "hf"}))
    plain = PlainPolicyConfig(**config.policy.model_dump()).model_copy(update={"backend": "plain"})
    assert plain.backend_section is plain.plain_cfg
    plan = plan_memory(config.model_copy(update={"policy": plain}), hf_model, cpu)
    # the defaults are the unsharded, unfused, no-recompute backend the transformers one is
    assert plan.parts == plan_memory(config, hf_model, cpu).parts


ALLOWED = {  # the registries and the backends' and engines' own modules
    "rlkit/policy/backends.py", "rlkit/generation/engines.py", "rlkit/config/engines.py", "rlkit/policy/dtensor.py",
    "rlkit/policy/hf.py", "rlkit/generation/vllm.py", "rlkit/generation/hf.py", "rlkit/generation/remote.py",
}
BRANCH = re.compile(r"backend(_section)?\.name *(==|!=)|generation\.backend *(==|!=)|\.backend *(==|!=) *[\"']"
                    r"|[\"'] *(==|!=) *[\w.]*\.backend\b")


def test_no_module_branches_on_a_backend_or_engine_name():
    root = Path(rlkit.__file__).parent
    found = [f"{path.relative_to(root.parent)}:{n}: {line.strip()}"
             for path in sorted(root.rglob("*.py")) if not str(path.relative_to(root.parent)).startswith(
                 ("rlkit/policy/megatron/",)) and str(path.relative_to(root.parent)) not in ALLOWED
             for n, line in enumerate(path.read_text().splitlines(), 1) if BRANCH.search(line)]
    assert not found, "branches on a backend's or engine's name; give its section or record the fact instead:\n" + \
        "\n".join(found)


def test_the_branch_pattern_catches_the_forms_it_is_for():
    for line in ('if policy.backend_section.name == "megatron":', 'if p.backend.name != "hf":',
                 'if g.backend == "hf":', 'x = "vllm" if config.policy.generation.backend == "vllm" else "hf"',
                 'if "dtensor" == cfg.backend:', 'if policy.generation.backend != "vllm" and x:'):
        assert BRANCH.search(line), line
    for line in ('if self.backend != backend:', 'backend == "nccl"', 'BACKENDS[cfg.backend](cfg, seed)'):
        assert not BRANCH.search(line), line
