"""An agent written against the real ``openai`` client drives a real session's engine (vLLM, Megatron-Core policy)
through the OpenAI-compatible endpoint: 8 concurrent two-turn episodes, rows holding exactly the ids the engine
sampled, and generator logprobs equal to the policy's after a refit.

Own module: the session (and its engine) is closed at the end, which must not meet another module's policy."""

import pytest

import rlkit
from rlkit.generation.openai_server import OpenAIEndpoint
from rlkit.stages.agent_rollout import agent_rollout
from tests.session.conftest import tiny_overrides


class Recording:
    """The session's engine, with every sampled sequence kept (the test compares the rows against them)."""

    def __init__(self, engine):
        self.engine, self.sampled = engine, []

    def generate(self, prompt_token_ids, n, sampling):
        generation = self.engine.generate(prompt_token_ids, n, sampling)
        self.sampled += [list(ids) for ids in generation.token_ids]
        return generation


async def two_turns(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model="rlkit-policy", messages=messages, max_tokens=6)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    second = await client.chat.completions.create(model="rlkit-policy", messages=messages, max_tokens=6)
    return float(second.choices[0].message.content.strip() == row["answer"])


@pytest.mark.slow
def test_agent_episodes_hold_the_sampled_ids_and_match_the_policy_after_a_refit(tmp_path):
    overrides = tiny_overrides(tmp_path, **{"data.digits": 1, "data.num_train": 100, "data.num_validation": 8,
                                            "policy.max_total_sequence_length": 48,
                                            "policy.generation.max_new_tokens": 6})
    with rlkit.Session.from_config("quickstart", overrides) as session:
        session.step()  # an optimizer step and a refit: the engine holds new weights
        assert session.policy.version == 1 and not session.stale
        engine = Recording(session.generator)
        rows = [dict(r) for r in session.dataset["validation"].select(range(2))]
        with OpenAIEndpoint(engine, session.tokenizer, session.sampling(), max_model_len=48) as endpoint:
            batch = agent_rollout(endpoint, two_turns, rows, num_generations=4, policy_version=session.policy.version)
        endpoint = session.openai_endpoint()  # the session's own: started once, closed with the session
        assert session.openai_endpoint() is endpoint and endpoint.base_url.startswith("http://127.0.0.1:")
        assert batch.batch_size == 8 and len(engine.sampled) == 16
        for row in range(8):
            ids = batch.input_ids[row].tolist()
            mask = batch.loss_mask[row].tolist()
            runs, k = [], 0
            while k < len(mask):
                j = k
                while j < len(mask) and mask[j] == mask[k]:
                    j += 1
                if mask[k]:
                    runs.append(ids[k:j])
                k = j
            assert len(runs) == 2 and all(run in engine.sampled for run in runs)
        batch = session.logprobs(batch)
        diff = (batch.generator_logprobs - batch.prev_logprobs).abs()[batch.loss_mask]
        assert diff.numel() > 16 and diff.max() <= 1e-3, diff.max().item()
    assert endpoint._server is None  # closed with the session
