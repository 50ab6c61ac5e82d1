"""One table of model families: every module reads its names from it, spelled one way."""

from typing import get_args

from rlkit.config.components import PolicyConfig
from rlkit.models.factory import PRESETS, architecture_name, hf_config
from rlkit.models.families import BY_NAME, FAMILIES, FAMILY_NAMES, MOE_FAMILIES, ModelFamily, family_of
from rlkit.policy.architecture import Architecture


def test_every_family_is_made_with_its_table_row_and_read_back_as_itself():
    assert get_args(ModelFamily) == FAMILY_NAMES == tuple(get_args(PolicyConfig.model_fields["model_family"].annotation))
    for family in FAMILIES:
        config = hf_config(PRESETS["nano-moe" if family.moe else "nano"], family.name)
        made = dict(config.to_dict(), architectures=[architecture_name(config)])
        assert made["architectures"] == [family.architecture] and type(config).__name__ == family.config_class
        arch = Architecture.from_hf_config(made)
        # one spelling: the Llama 3.x folder reads back as the llama family (its scaling comes from its config)
        assert arch.family == ("llama" if family.name == "llama3" else family.name)
        assert arch.qkv_bias == family.qkv_bias and arch.qk_layernorm == family.qk_norm
    assert MOE_FAMILIES == ("mixtral", "qwen2-moe", "qwen3-moe", "deepseek-v3", "gpt-oss")
    assert BY_NAME["qwen2-moe"].qkv_bias
    assert family_of(["GPT2LMHeadModel"]) is None
