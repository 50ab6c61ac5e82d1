"""The whole loop on a real pretrained model (SmolLM2-135M-Instruct, converted from its pinned wheel), one module:
one Session, real Megatron-Core policy and vLLM engine, a reasoning-gym task.

Against independent references, fp32:
- the Megatron policy's logits vs transformers' own model on the same folder: within 1e-5 of the logits' scale
  (:func:`rlkit.models.compare.logits_agreement`; the logits reach ~40 here, where an absolute 1e-4 was nearly
  met for no fault);
- after one GRPO step and a refit, vLLM's sampled-token logprobs vs the policy's: max 1e-3 (and the step moved
  the policy's logprobs of its own batch by more than 1e-2, so a refit that did nothing would fail);
- EOS: a sample that stops ends with ``<|im_end|>`` (id 2), the only EOS of the model, and its text does not;
- the export round trip: the exported folder, loaded by transformers, gives the policy's logits (same bound).
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.models.compare import logits_agreement
from rlkit.session import Session

OVERRIDES = {
    "policy.lora_cfg.enabled": False, "policy.optimizer.lr": 1e-4, "policy.scheduler.warmup_steps": 0,
    "grpo.num_prompts_per_step": 2, "grpo.num_generations_per_prompt": 4, "grpo.use_dynamic_sampling": False,
    "policy.generation.max_new_tokens": 24, "eval.num_prompts": 4, "data.num_train": 16, "data.num_validation": 4,
}


@pytest.fixture(scope="module")
def session(smollm2_folder):
    with Session.from_config("smollm2_quickstart", {**OVERRIDES, "policy.model_name": str(smollm2_folder)}) as s:
        yield s


def policy_logits(session, ids):
    session.policy.model.eval()
    with torch.no_grad():
        return session.policy.adapter.logits(ids)


def test_megatron_policy_matches_transformers_on_the_real_model(session, smollm2_folder):
    ids = session.tokenizer("What is 12 + 30? The answer is 42, since 12 + 30 = 42.", return_tensors="pt").input_ids
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_folder), dtype=torch.float32).eval()
    with torch.no_grad():
        agreement = logits_agreement(policy_logits(session, ids), hf(ids).logits)
    assert agreement.ok and agreement.scale > 10, agreement


def test_one_grpo_step_refit_and_export_round_trip(session, tmp_path):
    batch = session.advantages(session.logprobs(session.score(session.rollout())))
    # 8 samples of a 15%-accurate model often all earn 0, and then nothing moves; the refit check needs a step that
    # moves the weights, so each sample gets a fixed advantage of +-1 (the reward path is tested elsewhere)
    signs = torch.tensor([1.0, -1.0] * (batch.batch_size // 2)).unsqueeze(1)
    batch = batch.with_(advantages=torch.where(batch.loss_mask, signs, 0.0))
    session.train(batch)
    # the step moved the policy well past the refit bound on the tokens it trained on, so an engine left with the
    # old weights would fail the check below
    moved = (session.logprobs(batch).prev_logprobs - batch.generator_logprobs).abs()[batch.loss_mask]
    assert float(moved.max()) > 1e-2, float(moved.max())
    session.refit()
    fresh = session.logprobs(session.rollout())
    diff = (fresh.prev_logprobs - fresh.generator_logprobs).abs()[fresh.loss_mask]
    assert diff.numel() > 0 and float(diff.max()) <= 1e-3, float(diff.max())

    # EOS: the stopped samples end with <|im_end|>, which the completion text leaves out
    stopped = [i for i, r in enumerate(fresh.finish_reasons) if r == "stop"]
    assert stopped, fresh.completions
    for i in stopped:
        last = int(fresh.input_ids[i][fresh.attention_mask[i]][-1])
        assert last == session.tokenizer.eos_token_id == 2 and "<|im_end|>" not in fresh.completions[i]

    out = session.export_hf(tmp_path / "export")
    ids = fresh.input_ids[:2, :40]
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        agreement = logits_agreement(exported(ids).logits, policy_logits(session, ids))
    assert agreement.ok, agreement
