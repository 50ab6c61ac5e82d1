"""Small builders shared by tests (importable as ``tests.helpers``)."""

import torch

from rlkit.trajectories import LossCounts, Trajectories


def random_batch(b=8, t=20, vocab=100, prompt_len=5, seed=0, group_size=1) -> Trajectories:
    """A Trajectories batch with random tokens, ragged completion lengths and random advantages."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    lengths = torch.randint(prompt_len + 2, t + 1, (b,), generator=g)
    pos = torch.arange(t).unsqueeze(0)
    attention = pos < lengths.unsqueeze(1)
    loss_mask = attention & (pos >= prompt_len)
    ids = torch.where(attention, ids, torch.zeros_like(ids))
    adv = torch.randn(b, 1, generator=g).expand(b, t) * loss_mask
    return Trajectories(
        prompts=("p",) * b, completions=("c",) * b, input_ids=ids, attention_mask=attention,
        loss_mask=loss_mask, generator_logprobs=torch.zeros(b, t), finish_reasons=("stop",) * b,
        group_size=group_size, policy_version=0, advantages=adv,
    )


def pg_token_mean_loss(logprobs, batch: Trajectories, counts: LossCounts):
    """-advantage * logprob, summed over valid tokens and divided by the global valid-token count."""
    per_token = -batch.advantages * logprobs * batch.loss_mask
    loss = per_token.sum() / counts.valid_tokens
    return loss, {"loss": loss.detach()}


def arithmetic_prompts(n: int = 6) -> tuple[list[str], list[list[int]]]:
    """``n`` chat-templated addition prompts for the character tokenizer: their texts and token ids."""
    from rlkit.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    texts = [tok.apply_chat_template([{"role": "user", "content": f"{a}+{3 * a}="}], add_generation_prompt=True,
                                     tokenize=False) for a in range(n)]
    return texts, [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def generator_policy_mismatch(generator, policy, texts, ids, seed: int):
    """|policy logprob - generator logprob| over the completion tokens of 4 samples per prompt sampled with
    ``seed``, and the sampled batch."""
    from rlkit.generation.base import SamplingSettings
    from rlkit.stages.batching import trajectories_from_generation

    batch = trajectories_from_generation(generator.generate(ids, 4, SamplingSettings(max_new_tokens=24, seed=seed)),
                                         0, texts)
    diff = (policy.logprobs(batch.input_ids, batch.attention_mask).logprobs - batch.generator_logprobs).abs()
    return diff[batch.loss_mask], batch


def engine_beside_a_policy(path):
    """An fp32 Megatron policy (AdamW at lr 1e-2) and a vLLM engine, both on the folder ``path``; returns the policy,
    the engine and ``mismatch(seed)`` (:func:`generator_policy_mismatch` on the arithmetic prompts). The caller
    closes both."""
    from rlkit.config.components import GenerationConfig, OptimizerConfig, PolicyConfig
    from rlkit.generation.vllm import VllmGenerator
    from rlkit.policy.backends import in_process_policy

    texts, ids = arithmetic_prompts()
    policy = in_process_policy(PolicyConfig(model_name=str(path), optimizer=OptimizerConfig(lr=1e-2)))
    generator = VllmGenerator(path, GenerationConfig(), max_model_len=128, seed=0)
    return policy, generator, lambda seed: generator_policy_mismatch(generator, policy, texts, ids, seed)


def agree_then_step(policy, mismatch) -> None:
    """The engine agrees with the policy (max 1e-3, mean 1e-4, over more than 100 sampled tokens); then one policy
    step on random advantages, after which the engine, not refit yet, no longer does (max > 1e-2)."""
    diff, batch = mismatch(1)
    assert diff.max() < 1e-3 and diff.mean() < 1e-4 and batch.loss_mask.sum() > 100
    adv = torch.randn(batch.batch_size, 1, generator=torch.Generator().manual_seed(0)) * batch.loss_mask
    policy.train_step(batch.with_(advantages=adv), pg_token_mean_loss)
    assert mismatch(2)[0].max() > 1e-2  # the generator still holds the old weights


def train_one_step_from_the_cli(tmp_path, architecture: str, **overrides):
    """``rlkit train quickstart_nano`` on a model made from the preset with ``overrides`` (e.g. its family): two SFT
    steps, one GRPO step, the export read back; asserts the run and the exported architecture, returns the export's
    folder."""
    import json

    from rlkit.cli import main

    values = {"policy.model_name": str(tmp_path / "model"), "sft.num_steps": 2, "sft.batch_size": 8,
              "sft.warmup_steps": 0, "grpo.max_num_steps": 1, "grpo.num_prompts_per_step": 4,
              "grpo.num_generations_per_prompt": 4, "eval.num_prompts": 4, "logger.log_dir": str(tmp_path / "runs"),
              **overrides}
    out = tmp_path / "export"
    assert main(["train", "quickstart_nano", *(f"{k}={v}" for k, v in values.items()), "--export", str(out),
                 "--quiet"]) == 0
    summary = json.loads((tmp_path / "runs" / "quickstart_nano" / "summary.json").read_text())
    assert summary["rl_steps"] == 1
    assert json.loads((out / "config.json").read_text())["architectures"] == [architecture]
    return out


def own_generator_matches_a_full_forward(model_folder) -> list[int]:
    """policy.generation.backend=megatron on ``model_folder``: two prompts x 2 samples of up to 40 new tokens from
    the policy's own KV-cached decode; each sampled token's logprob equals a full forward's within 1e-5. Returns
    each sample's total length (prompt + completion), for the caller's check that decoding went past a window."""
    import torch

    from rlkit.config.components import GenerationConfig, PolicyConfig
    from rlkit.generation.base import SamplingSettings
    from rlkit.policy.backends import in_process_policy

    policy = in_process_policy(PolicyConfig(model_name=str(model_folder)))
    try:
        generator = policy.adapter.own_generator(GenerationConfig(), 128, 0)
        prompts = [list(range(3, 43)), list(range(50, 80))]
        out = generator.generate(prompts, 2, SamplingSettings(max_new_tokens=40, seed=0))
        policy.model.eval()
        lengths = []
        for prompt, tokens, logprobs in zip([p for p in prompts for _ in range(2)], out.token_ids, out.logprobs):
            ids = torch.tensor([prompt + list(tokens)])
            with torch.no_grad():
                logits = policy.adapter.logits(ids)[:, :-1].float()
            scored = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[0, len(prompt) - 1:, 0]
            assert (scored - torch.tensor(logprobs)).abs().max() < 1e-5
            lengths.append(ids.shape[1])
        return lengths
    finally:
        policy.close()
