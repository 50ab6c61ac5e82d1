"""policy.generation.backend=megatron: sampling from the Megatron policy's own model (rlkit.policy.megatron.generator).

What it must show: the sampled tokens' logprobs are the trainer's (the same weights: no copy, so within float32
noise, 1e-5), before and after an update, with a refit that moves nothing; greedy decoding equals transformers'
own greedy ``generate`` on the same folder (an independent reference); the processed logprobs under top-k/top-p are
the truncated, renormalised distribution's; seeds as the Generator contract says (a call's seed fixes its samples,
a sample does not depend on its batch-mates); EOS, stop strings and max_new_tokens end samples; the settings it
cannot serve are refused at load with the fix."""

import pytest
import torch

import rlkit
from rlkit.errors import ConfigError
from rlkit.generation.base import Generator, SamplingSettings

NANO = {"policy.model_preset": "nano", "data.digits": 1, "data.num_train": 64, "data.num_validation": 16,
        "eval.num_prompts": 16, "sft.enabled": False, "policy.generation.max_new_tokens": 8,
        "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4, "grpo.use_dynamic_sampling": False,
        "policy.generation.backend": "megatron"}
TOL = 1e-5


def overrides(tmp_path, **extra):
    return {**NANO, "policy.model_name": str(tmp_path / "model"), "logger.log_dir": str(tmp_path / "runs"), **extra}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A nano session after a short SFT warm start (so that samples end at EOS too), generating with Megatron."""
    tmp = tmp_path_factory.mktemp("megatron-generator")
    with rlkit.Session.from_config("quickstart_nano", overrides(tmp)) as s:
        s.sft(40, progress=False)
        yield s


def test_samples_logprobs_are_the_trainers_before_and_after_an_update(session):
    generator = session.current.generator
    assert isinstance(generator, Generator) and repr(session.current.components.weight_sync).startswith("Shared")
    batch = session.logprobs(session.score(session.rollout()))
    mask = batch.loss_mask
    assert (batch.generator_logprobs - batch.prev_logprobs)[mask].abs().max() < TOL
    assert "stop" in batch.finish_reasons  # (after SFT) samples end at EOS as well as at max_new_tokens
    prompts = [list(r) for r in batch.input_ids[::4, :6].tolist()]
    fixed = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=11)
    before, version = generator.generate(prompts, 2, fixed), session.current.policy.version
    session.train(session.advantages(batch))
    report = session.refit()  # nothing copied: the generator reads the weights the step just changed
    assert report.bytes_moved == 0 and report.num_tensors == 0
    assert report.policy_version == session.current.policy.version == version + 1
    after_update = generator.generate(prompts, 2, fixed)
    assert after_update.logprobs != before.logprobs  # the same seed and prompts: the new weights' numbers
    after = session.logprobs(session.rollout())
    assert after.policy_version == report.policy_version
    assert (after.generator_logprobs - after.prev_logprobs)[after.loss_mask].abs().max() < TOL


def test_greedy_decoding_equals_transformers_generate(session, tmp_path):
    from rlkit.config.components import GenerationConfig
    from rlkit.generation.hf import HFGenerator

    folder = session.export_hf(tmp_path / "export")
    prompts = [list(row) for row in session.rollout().input_ids[::4, :6].tolist()]
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=8)
    ours = session.current.generator.generate(prompts, 1, greedy)
    theirs = HFGenerator(folder, GenerationConfig(backend="hf"), max_model_len=64).generate(prompts, 1, greedy)
    assert ours.token_ids == theirs.token_ids and ours.finish_reasons == theirs.finish_reasons
    for a, b in zip(ours.logprobs, theirs.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=TOL)


def test_top_k_and_top_p_logprobs_are_the_truncated_distributions(session):
    generator, policy = session.current.generator, session.current.policy
    prompt = [list(session.rollout().input_ids[0, :6].tolist())]
    for sampling, keep in ((SamplingSettings(temperature=0.7, top_k=3, max_new_tokens=4, seed=1), "k"),
                           (SamplingSettings(temperature=1.3, top_p=0.6, max_new_tokens=4, seed=2), "p")):
        out = generator.generate(prompt, 4, sampling)
        for tokens, logprobs in zip(out.token_ids, out.logprobs):
            ids = torch.tensor([prompt[0] + list(tokens)])
            logits = policy.adapter.logits(ids)[0, len(prompt[0]) - 1:-1].detach().double() / sampling.temperature
            for position, (token, logprob) in enumerate(zip(tokens, logprobs)):
                row = logits[position]
                if keep == "k":
                    kept = row >= torch.topk(row, 3).values[-1]
                else:  # the smallest set of the most likely tokens whose mass reaches top_p
                    ordered, order = torch.sort(row, descending=True)
                    mass_above = torch.softmax(ordered, -1).cumsum(-1) - torch.softmax(ordered, -1)
                    kept = torch.zeros_like(row, dtype=torch.bool)
                    kept[order[mass_above < sampling.top_p]] = True
                assert kept[token]
                expected = torch.log_softmax(row.masked_fill(~kept, float("-inf")), -1)[token]
                assert abs(logprob - float(expected)) < TOL


def test_seeds_fix_the_samples_and_a_sample_does_not_depend_on_its_batch_mates(session):
    generator = session.current.generator
    prompts = [list(r) for r in session.rollout().input_ids[::4, :6].tolist()][:3]
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=7)
    first, again = generator.generate(prompts, 3, sampling), generator.generate(prompts, 3, sampling)
    assert first.token_ids == again.token_ids
    other = generator.generate(prompts, 3, SamplingSettings(temperature=1.0, max_new_tokens=6, seed=8))
    assert other.token_ids != first.token_ids
    alone = generator.generate(prompts[:1], 3, sampling)  # prompt 0's request alone: the same streams
    assert alone.token_ids == first.token_ids[:3]


def test_stop_strings_and_max_new_tokens_end_samples(session):
    generator = session.current.generator
    prompts = [list(r) for r in session.rollout().input_ids[::4, :6].tolist()]
    out = generator.generate(prompts, 2, SamplingSettings(temperature=1.0, max_new_tokens=3, seed=3))
    assert all(len(t) <= 3 for t in out.token_ids)
    assert all(r == "length" for t, r in zip(out.token_ids, out.finish_reasons) if t[-1] not in generator.eos_token_ids)
    text = out.texts[0]
    if len(text) >= 2:  # stop at the sample's own second character: it ends there, "stop", the string cut out
        stop = text[1]
        cut = generator.generate(prompts[:1], 2, SamplingSettings(temperature=1.0, max_new_tokens=3, seed=3,
                                                                  stop_strings=(stop,)))
        assert cut.finish_reasons[0] == "stop" and stop not in cut.texts[0]


@pytest.mark.parametrize("extra, words", [
    ({"policy.backend": "dtensor", "policy.dtensor_cfg.enabled": True}, "policy.backend=megatron"),
    ({"policy.num_workers": 2}, "policy.num_workers=1"),
    ({"grpo.async_grpo.enabled": True, "loss_fn.off_policy_correction": "tis"}, "async_grpo.enabled=false"),
    ({"policy.lora_cfg.enabled": True, "policy.lora_cfg.release_base_while_generating": True},
     "release_base_while_generating"),
])
def test_what_it_cannot_serve_is_refused_at_load_with_the_fix(tmp_path, extra, words):
    from rlkit.config.loading import load_config

    with pytest.raises(ConfigError, match="policy.generation.backend=megatron") as caught:
        load_config("quickstart_nano", overrides(tmp_path, **extra))
    assert words in str(caught.value)


def test_the_memory_plan_counts_no_engine_copy(tmp_path, model_factory):
    from rlkit.config.loading import load_config
    from rlkit.memory.plan import plan_memory

    folder = model_factory("nano", "llama")
    config = load_config("quickstart_nano", overrides(tmp_path, **{"policy.model_name": str(folder)}))
    vllm = load_config("quickstart_nano", overrides(tmp_path, **{"policy.model_name": str(folder),
                                                                 "policy.generation.backend": "vllm"}))
    ours, theirs = plan_memory(config), plan_memory(vllm)
    assert ours.parts["engine weights"] == 0 and theirs.parts["engine weights"] > 0
    assert "policy's own weights" in ours.reasons["engine weights"]


@pytest.mark.parametrize("extra", [{"policy.lora_cfg.enabled": True, "policy.lora_cfg.dim": 4},
                                   {"policy.precision": "bfloat16"}], ids=["adapters", "bf16"])
def test_adapters_and_bf16_sample_from_what_the_policy_computes_with(tmp_path, extra):
    """The adapted model samples (adapters); the bf16 copy the passes compute with samples (bf16): the generator's
    logprobs are the trainer's within 1e-5, and under bf16 apart from an fp32 forward of the same weights."""
    from tests.stages.test_distillation import direct_teacher_logprobs

    with rlkit.Session.from_config("quickstart_nano", overrides(tmp_path, **extra)) as s:
        s.sft(20, progress=False)
        batch = s.logprobs(s.rollout())
        mask = batch.loss_mask
        assert (batch.generator_logprobs - batch.prev_logprobs)[mask].abs().max() < TOL
        if "policy.precision" in extra:
            folder, temperature = s.export_hf(tmp_path / "export"), s.config.policy.generation.temperature
            fp32 = direct_teacher_logprobs(folder, batch, temperature)
            assert (batch.generator_logprobs.double() - fp32)[mask].abs().max() > 1e-3  # not the fp32 masters
