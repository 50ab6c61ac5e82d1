"""The value models on the policy's backends over two ranks against one process (slow: two spawned gloo ranks, about
40 s each layout): Megatron's under tensor parallelism 2 (with and without sequence parallelism), DTensor's with FSDP2
over 2 ranks (which split the rows).

Both users of the value model: PPO's critic (its values, one train step's value loss, gradient norm and the values
after the step) and reward-model training (one Bradley-Terry step's loss, the pair scores after it, and the exported
sequence-classification weights). Each must equal the same backend's single-process value model's within 1e-5, and the
step must move the values by far more than that (so a missing or doubled gradient reduction over the ranks would
show). The ranks are spawned by torch.multiprocessing and each makes one gloo group from RANK/WORLD_SIZE, which the
models join (rlkit's process group uses the one it finds).
"""

import os
import socket

import pytest
import torch

from rlkit.config.backends import MegatronConfig
from rlkit.config.components import PolicyConfig
from rlkit.config.run import CriticConfig, RewardModelConfig
from tests.helpers import random_batch

pytestmark = pytest.mark.slow

TOL = 1e-5
PAIRS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(3) for b in range(2)]


def layout(path: str, name: str, ranks: int) -> PolicyConfig:
    """The policy's config for the value model's layout ``name`` (LAYOUTS) over ``ranks`` processes."""
    if name == "dtensor":
        return PolicyConfig(model_name=path, backend="dtensor")  # FSDP over every rank of the group
    return PolicyConfig(model_name=path, megatron_cfg=MegatronConfig(tensor_model_parallel_size=ranks,
                                                                     sequence_parallel=name == "megatron-sp"))


LAYOUTS = ["megatron", "megatron-sp", "dtensor"]


def run_both(policy: PolicyConfig) -> dict:
    """The critic's and the reward model's numbers on ``policy.model_name`` in this rank's layout ``policy``."""
    from rlkit.policy.critic import Critic
    from rlkit.policy.value_model import build_value_model
    from rlkit.stages.reward_model import reward_model_step, reward_model_tokenizer, value_pair_scores

    path = policy.model_name
    # 21: not a multiple of 2, so sequence parallelism pads; 7 rows in microbatches of 4 and 3: FSDP's 2 ranks take
    # 2 rows each of both (one a padding row), and the gradients of two microbatches are reduced once
    batch = random_batch(b=7, t=21)
    scored = batch.loss_mask
    returns = torch.randn(scored.shape, generator=torch.Generator().manual_seed(3)) * scored
    critic = Critic(path, CriticConfig(enabled=True, backend="policy", lr=3e-3, micro_batch_size=4), seed=1,
                    policy=policy)
    try:
        values = critic.values(batch.input_ids, batch.attention_mask, scored)
        metrics = critic.train_step(batch.input_ids, batch.attention_mask, scored, values, returns)
        after = critic.values(batch.input_ids, batch.attention_mask, scored)
    finally:
        critic.close()
    out = {"values": values, "metrics": metrics, "after": after}
    rm = build_value_model("policy", path, bias=False, seed=2, policy=policy, key="reward_model.backend")
    try:
        tokenizer = reward_model_tokenizer(path)
        cfg = RewardModelConfig(lr=1e-3, batch_size=len(PAIRS))
        optimizer = torch.optim.SGD([p for _, p in rm.named_trained_parameters()], lr=0.5)  # (Adam's first step
        # turns gradients of ~1e-9 into full steps: SGD keeps the comparison about the gradients themselves)
        out["rm_loss"], _ = reward_model_step(rm, optimizer, tokenizer, PAIRS, cfg, None)
        rm.module.eval()
        with torch.no_grad():
            out["rm_scores"] = torch.cat(value_pair_scores(rm, tokenizer, PAIRS, None, None))
        out["rm_state"] = rm.export_hf_state()
    finally:
        rm.close()
    return out


def _rank(rank: int, world: int, port: int, path: str, name: str, result: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # one group for both models (rlkit's acquire leaves a group it finds alone): a second rendezvous on the port
    # could race the first one's store going away
    torch.distributed.init_process_group("gloo")
    try:
        out = run_both(layout(path, name, world))
        if rank == 0:
            torch.save(out, result)
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model(model_factory):
    return str(model_factory("nano", "qwen2", seed=1, num_key_value_heads=2))  # two KV heads: TP=2 is valid


@pytest.fixture(scope="module")
def one_process(model):
    """Each backend's numbers in this one process (the layouts of a backend agree there)."""
    made = {}

    def numbers(name: str) -> dict:
        backend = "dtensor" if name == "dtensor" else "megatron"
        if backend not in made:
            made[backend] = run_both(layout(model, backend, 1))
        return made[backend]
    return numbers


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_value_model_over_2_ranks_matches_one_process(model, one_process, name, tmp_path):
    result = tmp_path / "rank0.pt"
    torch.multiprocessing.start_processes(_rank, args=(2, free_port(), model, name, str(result)),
                                          nprocs=2, join=True, start_method="spawn")
    tp2, ref = torch.load(result), one_process(name)
    assert (ref["after"] - ref["values"]).abs().max() > 100 * TOL  # the critic's step moved the values
    assert (tp2["values"] - ref["values"]).abs().max() < TOL
    for key, value in ref["metrics"].items():
        assert abs(tp2["metrics"][key] - value) < TOL * max(1.0, abs(value)), key
    assert (tp2["after"] - ref["after"]).abs().max() < TOL
    assert abs(tp2["rm_loss"] - ref["rm_loss"]) < TOL
    assert (tp2["rm_scores"] - ref["rm_scores"]).abs().max() < TOL
    assert tp2["rm_state"].keys() == ref["rm_state"].keys() and "score.weight" in ref["rm_state"]
    assert max((tp2["rm_state"][k] - ref["rm_state"][k]).abs().max().item() for k in ref["rm_state"]) < TOL
