"""rlkit's Tinker service driven by the real ``tinker`` SDK, the way its docs use it, on the nano model with LoRA.

What forward_backward returns is checked against the Session's own ``logprobs()`` / ``loss()`` on the same tokens
(1e-5) and against an independent reference: a float64 transformers forward of the model folder (the adapters start
at zero, so the policy is the folder's model) and the losses' formulas applied to the returned logprobs. One
optim_step is checked against a second Session's own ``train()`` on the same batch with the same Adam settings
(bitwise). After save_weights_for_sampler, the sampled tokens' logprobs are the trained policy's (1e-3) and not
the model folder's. Then the edges: 501s that name the route, a second client refused, the loopback default."""

import os
import warnings

import httpx
import numpy as np
import pytest
import torch

import rlkit
from rlkit.tinker_api import TinkerLoss, TinkerService
from rlkit.tinker_api.convert import Datum, datums_to_batch
from rlkit.trajectories import Trajectories

tinker = pytest.importorskip("tinker")
# the importance-sampling datums carry made-up sampler logprobs, which the logprobs stage rightly finds far off
pytestmark = pytest.mark.filterwarnings("ignore:generator and trainer logprobs disagree")
types = tinker.types

NANO = {"policy.model_preset": "nano", "data.digits": 1, "data.num_train": 200, "data.num_validation": 16,
        "eval.num_prompts": 16, "sft.enabled": False, "policy.max_total_sequence_length": 28,
        "policy.generation.max_new_tokens": 8, "grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 4,
        "grpo.use_dynamic_sampling": False, "policy.lora_cfg.enabled": True, "policy.lora_cfg.dim": 4,
        "policy.max_grad_norm": None}
RANK = 4
ADAM = types.AdamParams(learning_rate=5e-2, beta1=0.9, beta2=0.95, eps=1e-12)
# two sequences of different lengths (the batch is padded), in the nano model's vocabulary
SEQS = [[1, 5, 9, 79, 12, 2, 6, 94, 50, 26], [1, 5, 9, 80, 11, 2, 6, 40, 41, 42, 43, 44, 45]]
PROMPT_LEN = 7


def overrides(folder, tmp, **extra):
    return {**NANO, "policy.model_name": str(folder), "logger.log_dir": str(tmp / "runs"), **extra}


@pytest.fixture(scope="module")
def served(model_factory, tmp_path_factory):
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    folder, tmp = model_factory("nano"), tmp_path_factory.mktemp("tinker")
    session = rlkit.Session.from_config("quickstart_nano", overrides(folder, tmp))
    session.save(tmp / "runs" / "tinker_checkpoints" / "fresh")  # the start, for tests that need it whatever ran before
    service = TinkerService(session).start()
    client = tinker.ServiceClient(base_url=service.base_url, api_key=service.api_key)
    yield session, service, client, folder, tmp
    client.close("success").result()
    service.close()
    session.close()
    for other in LATER:  # a second Megatron session in this process is closed after the first (they share its state)
        other.close()


LATER = []


def datums(kind, rng=None):
    out = []
    for seq in SEQS:
        n = len(seq) - 1
        inputs = {"target_tokens": seq[1:]}
        if kind == "cross_entropy":
            inputs["weights"] = [0.0] * (PROMPT_LEN - 1) + [1.0] * (n - PROMPT_LEN + 1)
        else:
            inputs["logprobs"] = (-rng.uniform(3.0, 6.0, n)).astype(np.float32)
            inputs["advantages"] = rng.normal(size=n).astype(np.float32)
        out.append(types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]), loss_fn_inputs=inputs))
    return out


def as_batch(session, data, loss_fn, config=None):
    """The same datums as the Session's own batch (what the service builds from the wire)."""
    plain = [Datum(tuple(d.model_input.to_ints()), {k: v.to_numpy() for k, v in d.loss_fn_inputs.items()})
             for d in data]
    return datums_to_batch(plain, loss_fn, config or {}, session.tokenizer.pad_token_id, session.policy.version)


def transformers_logprobs(folder, seq):
    """log p(seq[t] | seq[:t]) for t >= 1 by transformers itself, in float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:]).view(-1, 1)).flatten()


def trainable(session):
    return {n: p.detach().clone() for n, p in session.policy.model.named_parameters() if p.requires_grad}


def test_forward_backward_returns_the_sessions_logprobs_and_loss(served):
    session, _, client, folder, _ = served
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()
    rng = np.random.default_rng(0)
    for kind in ("cross_entropy", "importance_sampling"):
        data = datums(kind, rng)
        out = training.forward_backward(data, kind).result()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cross_entropy's batch has no sampler logprobs to compare with
            own = session.logprobs(as_batch(session, data, kind))
        assert isinstance(session.loss_fn, TinkerLoss)
        own_loss = session.loss(own).metrics["loss"]
        assert out.metrics["loss:sum"] == pytest.approx(own_loss, abs=1e-5)
        by_formula = 0.0
        for i, (datum, seq) in enumerate(zip(data, SEQS)):
            returned = torch.tensor(out.loss_fn_outputs[i]["logprobs"].tolist())
            assert returned.shape == (len(seq) - 1,)
            assert torch.allclose(returned, own.prev_logprobs[i, 1:len(seq)], atol=1e-5, rtol=0)
            assert torch.allclose(returned.double(), transformers_logprobs(folder, seq), atol=1e-4, rtol=0)
            inputs = {k: torch.tensor(v.tolist()) for k, v in datum.loss_fn_inputs.items()}
            if kind == "cross_entropy":
                by_formula += float(-(inputs["weights"] * returned).sum())
            else:
                by_formula += float(-(inputs["advantages"] * torch.exp(returned - inputs["logprobs"])).sum())
            terms = torch.tensor(out.loss_fn_outputs[i]["elementwise_loss"].tolist())
            by_datum = -(inputs["weights"] * returned) if kind == "cross_entropy" else \
                -(inputs["advantages"] * torch.exp(returned - inputs["logprobs"]))
            assert torch.allclose(terms, by_datum, atol=1e-5, rtol=0)
        assert out.metrics["loss:sum"] == pytest.approx(by_formula, abs=1e-4)


def test_forward_alone_takes_no_step_and_ppo_cispo_follow_their_formulas(served):
    session, _, client, folder, _ = served
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()
    rng = np.random.default_rng(1)
    data = datums("ppo", rng)
    ppo = training.forward(data, "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).result()
    cispo = training.forward(data, "cispo").result()
    expected_ppo = expected_cispo = 0.0
    for i, datum in enumerate(data):
        lp = torch.tensor(ppo.loss_fn_outputs[i]["logprobs"].tolist())
        a, q = (torch.tensor(datum.loss_fn_inputs[k].tolist()) for k in ("advantages", "logprobs"))
        r = torch.exp(lp - q)
        expected_ppo += float(-torch.minimum(r * a, r.clamp(0.9, 1.1) * a).sum())
        expected_cispo += float(-(r.clamp(0.8, 1.2) * lp * a).sum())
    assert ppo.metrics["loss:sum"] == pytest.approx(expected_ppo, abs=1e-4)
    assert cispo.metrics["loss:sum"] == pytest.approx(expected_cispo, abs=1e-4)
    with pytest.raises(tinker.RequestFailedError, match="no forward_backward since the last optim_step"):
        training.optim_step(ADAM).result()  # forward() keeps nothing to train on
    with pytest.raises(tinker.RequestFailedError, match="'stable_reinforce' is not implemented"):
        training.forward_backward(data, "stable_reinforce").result()


def test_dro_and_gspo_through_the_sdk_follow_tinkers_formulas(served):
    """The SDK's dro and gspo (forward: no step) against the documented formulas in float64 on the returned
    logprobs, which are the Session's own; a gspo datum sends its sequence_ratio_mask on the wire."""
    session, _, client, folder, _ = served
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()
    data = datums("dro", np.random.default_rng(5))
    with_mask = [types.Datum(model_input=d.model_input, loss_fn_inputs={
        **{k: v.to_numpy() for k, v in d.loss_fn_inputs.items()},
        "sequence_ratio_mask": np.array([0.0] * (PROMPT_LEN - 1) + [1.0] * (len(seq) - PROMPT_LEN), np.float32)})
        for d, seq in zip(data, SEQS)]
    clips = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    dro = training.forward(data, "dro", {"beta": 0.05}).result()
    gspo = training.forward(with_mask, "gspo", clips).result()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = session.logprobs(as_batch(session, data, "dro", {"beta": 0.05}))
    expected_dro = expected_gspo = 0.0
    for i, (datum, seq) in enumerate(zip(with_mask, SEQS)):
        lp = np.array(dro.loss_fn_outputs[i]["logprobs"].tolist(), dtype=np.float64)
        assert np.allclose(lp, own.prev_logprobs[i, 1:len(seq)].double().numpy(), atol=1e-5, rtol=0)
        assert np.array_equal(lp, np.array(gspo.loss_fn_outputs[i]["logprobs"].tolist()))  # no step between
        a, q, m = (datum.loss_fn_inputs[k].to_numpy().astype(np.float64)
                   for k in ("advantages", "logprobs", "sequence_ratio_mask"))
        dro_terms = -(lp * a - 0.5 * 0.05 * (lp - q) ** 2)
        s = np.exp((lp - q)[m != 0].mean())
        gspo_terms = -np.minimum(s * a, np.clip(s, 0.9, 1.1) * a)
        assert np.allclose(dro.loss_fn_outputs[i]["elementwise_loss"].tolist(), dro_terms, atol=1e-4, rtol=1e-5)
        assert np.allclose(gspo.loss_fn_outputs[i]["elementwise_loss"].tolist(), gspo_terms, atol=1e-4, rtol=1e-5)
        expected_dro += dro_terms.sum()
        expected_gspo += gspo_terms.sum()
    assert dro.metrics["loss:sum"] == pytest.approx(expected_dro, abs=1e-3, rel=1e-5)
    assert gspo.metrics["loss:sum"] == pytest.approx(expected_gspo, abs=1e-3, rel=1e-5)
    with pytest.raises(tinker.RequestFailedError, match=r"'dro' needs loss_fn_config keys \['beta'\]"):
        training.forward(data, "dro").result()


def test_optim_step_moves_the_weights_as_the_sessions_own_train_step(served):
    session, _, client, folder, tmp = served
    assert session.policy.version == 0, "this test runs before any other step (the file's order)"
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()
    before, steps_before = trainable(session), len(session.history)
    rng = np.random.default_rng(2)
    ce, rl = datums("cross_entropy", rng), datums("importance_sampling", rng)
    training.forward_backward(ce, "cross_entropy")
    training.forward_backward(rl, "importance_sampling")
    result = training.optim_step(ADAM).result()
    served_after = trainable(session)
    assert result.metrics["learning_rate:mean"] == ADAM.learning_rate
    assert len(session.history) == steps_before + 1  # the notebook sees the step the script took
    assert session.history[-1]["train/learning_rate"] == ADAM.learning_rate  # the rate used, not the schedule's
    assert max((served_after[n] - before[n]).abs().max().item() for n in before) > 1e-3

    own = rlkit.Session.from_config("quickstart_nano", overrides(
        folder, tmp, **{"logger.log_dir": str(tmp / "own"), "policy.optimizer.lr": ADAM.learning_rate,
                        "policy.optimizer.betas": [ADAM.beta1, ADAM.beta2], "policy.optimizer.eps": ADAM.eps}))
    LATER.append(own)
    assert all(torch.equal(p, before[n]) for n, p in trainable(own).items())
    own.loss_fn = TinkerLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = own.logprobs(Trajectories.concat([as_batch(own, ce, "cross_entropy"),
                                                  as_batch(own, rl, "importance_sampling")]))
    own.train(batch)
    own_after = trainable(own)
    assert all(torch.equal(served_after[n], own_after[n]) for n in own_after), \
        max((served_after[n] - own_after[n]).abs().max().item() for n in own_after)


def test_a_custom_loss_runs_on_the_client_through_cross_entropy(served):
    """The SDK computes a custom loss on the client: a forward, then a backward whose cross-entropy weights are the
    loss's gradient (-dC/dlogprobs), which the service trains on like any cross-entropy batch."""
    session, _, client, folder, _ = served
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()

    def squares(data, logprobs):
        loss = sum((lp ** 2).sum() for lp in logprobs)
        return loss, {"squares:sum": float(loss.detach())}

    version = session.policy.version
    out = training.forward_backward_custom(datums("cross_entropy"), squares).result()
    lps = [session.policy.logprobs(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.bool)).logprobs[0, 1:].double()
           for s in SEQS]
    assert out.metrics["loss:sum"] == pytest.approx(float(sum((lp ** 2).sum() for lp in lps)), rel=1e-5)
    # the backward's cross-entropy with weights -2 lp: sum(-w * lp) = sum(2 lp^2)
    assert out.metrics["surrogate_loss:sum"] == pytest.approx(2 * out.metrics["loss:sum"], rel=1e-5)
    training.optim_step(ADAM).result()
    assert session.policy.version == version + 1


def test_the_sampler_samples_the_saved_weights(served):
    session, _, client, folder, _ = served
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(SEQS[0][:PROMPT_LEN])
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    result = sampler.sample(prompt, 3, params).result()
    assert len(result.sequences) == 3
    moved = 0.0
    for seq in result.sequences:
        ids = torch.tensor([SEQS[0][:PROMPT_LEN] + list(seq.tokens)])
        mask = torch.ones_like(ids, dtype=torch.bool)
        policy = session.policy.logprobs(ids, mask).logprobs[0, PROMPT_LEN:]
        folder_model = session.policy.reference_logprobs(ids, mask).logprobs[0, PROMPT_LEN:]
        sampled = torch.tensor(seq.logprobs)
        assert torch.allclose(sampled, policy, atol=1e-3, rtol=0)
        moved = max(moved, (sampled - folder_model).abs().max().item())
    assert moved > 1e-2  # the engine samples the trained weights, not the folder's: the refit took

    # the RL round trip of a Tinker recipe: the samples, with their sampler logprobs, as importance-sampling datums
    rl = []
    for seq in result.sequences:
        full, k = SEQS[0][:PROMPT_LEN] + list(seq.tokens), len(seq.tokens)
        rl.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
            "target_tokens": full[1:], "logprobs": [0.0] * (PROMPT_LEN - 1) + list(seq.logprobs),
            "advantages": [0.0] * (PROMPT_LEN - 1) + [1.0] * k}))
    forward = training.forward(rl, "importance_sampling").result()
    for seq, out in zip(result.sequences, forward.loss_fn_outputs):
        trained = torch.tensor(out["logprobs"].tolist())[PROMPT_LEN - 1:]
        assert torch.allclose(trained, torch.tensor(seq.logprobs), atol=1e-3, rtol=0)
    total = sum(len(seq.tokens) for seq in result.sequences)
    assert forward.metrics["loss:sum"] == pytest.approx(-total, abs=1e-2)  # every ratio is 1: on-policy

    # stop tokens: the same seed samples the same tokens, cut after the first stop token
    first = result.sequences[0]
    stop = first.tokens[1]
    cut = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=6, temperature=1.0, seed=3, stop=[stop])).result()
    assert list(cut.sequences[0].tokens) == list(first.tokens[:first.tokens.index(stop) + 1])
    assert cut.sequences[0].stop_reason == "stop"

    full = SEQS[1]
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
    ids = torch.tensor([full])
    expected = session.policy.logprobs(ids, torch.ones_like(ids, dtype=torch.bool)).logprobs[0, 1:]
    assert logprobs[0] is None
    assert torch.allclose(torch.tensor(logprobs[1:]), expected, atol=1e-5, rtol=0)


def liked_mass(session, folder, prompt, liked):
    """The policy's probability that the token after ``prompt`` is one of ``liked`` (every next token scored)."""
    from transformers import AutoConfig

    ids = torch.tensor([prompt + [t] for t in range(AutoConfig.from_pretrained(str(folder)).vocab_size)])
    logprobs = session.policy.logprobs(ids, torch.ones_like(ids, dtype=torch.bool)).logprobs[:, -1]
    return float(logprobs[list(liked)].exp().sum())


def test_a_tinker_rl_loop_raises_its_reward(served):
    """The shape of a Tinker RL recipe, all through the SDK: sample groups, reward them in Python, center the rewards
    per group, train on the samples with importance_sampling and their sampler logprobs, save for the sampler, again.
    The expected reward rises: the policy's probability of a rewarded first token (a quarter of the vocabulary; the
    random nano model's logits are flat, so adapters move it slowly)."""
    session, _, client, folder, _ = served
    training = client.create_training_client_from_state("tinker://start/weights/fresh").result()  # fresh AdamW too
    vocab = session.tokenizer.vocab_size
    liked = set(range(vocab // 2, vocab // 2 + vocab // 4))
    prompts = [seq[:PROMPT_LEN] for seq in SEQS]
    before = liked_mass(session, folder, prompts[0], liked)
    sampler = training.save_weights_and_get_sampling_client().result()
    for step in range(12):
        futures = [sampler.sample(types.ModelInput.from_ints(p), 8,
                                  types.SamplingParams(max_tokens=4, temperature=1.0, seed=100 * step + i))
                   for i, p in enumerate(prompts)]
        data = []
        for prompt, future in zip(prompts, futures):
            group = future.result().sequences
            reward = np.array([np.mean([t in liked for t in seq.tokens]) for seq in group])
            for seq, advantage in zip(group, reward - reward.mean()):
                full, k = prompt + list(seq.tokens), len(seq.tokens)
                data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
                    "target_tokens": full[1:], "logprobs": [0.0] * (len(prompt) - 1) + list(seq.logprobs),
                    "advantages": [0.0] * (len(prompt) - 1) + [float(advantage)] * k}))
        training.forward_backward(data, "importance_sampling")
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        sampler = training.save_weights_and_get_sampling_client().result()
    after = liked_mass(session, folder, prompts[0], liked)
    assert after > before + 0.015, (before, after)


def test_save_state_and_load_state_are_the_sessions_checkpoints(served):
    session, _, client, folder, tmp = served
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM).result()
    saved, version = trainable(session), session.policy.version
    path = training.save_state("first").result().path
    assert path.endswith("/weights/first") and (tmp / "runs" / "tinker_checkpoints" / "first").is_dir()
    with pytest.raises(tinker.RequestFailedError, match="exists"):
        training.save_state("first").result(timeout=30)
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM).result()
    assert not all(torch.equal(p, saved[n]) for n, p in trainable(session).items())
    restored = client.create_training_client_from_state_with_optimizer(path).result()
    assert all(torch.equal(p, saved[n]) for n, p in trainable(session).items())
    assert session.policy.version == version and not session.stale  # the generator was refit
    assert session.policy.optimizer.state  # Adam's moments came back with the weights
    restored.forward_backward(datums("cross_entropy"), "cross_entropy").result()  # the new client trains
    client.create_training_client_from_state(path).result()  # weights only: a fresh optimizer
    assert all(torch.equal(p, saved[n]) for n, p in trainable(session).items())
    assert not session.policy.optimizer.state
    with pytest.raises(tinker.RequestFailedError, match="unknown checkpoint"):
        client.create_training_client_from_state("tinker://elsewhere/weights/missing").result(timeout=30)


def test_routes_not_served_answer_501_naming_them(served):
    session, service, client, folder, _ = served
    key = {"X-API-Key": service.api_key}
    for method, route in (("POST", "/api/v1/telemetry"), ("GET", "/api/v1/training_runs"),
                          ("POST", "/api/v1/billing/usage/events")):
        response = httpx.request(method, service.base_url + route, headers=key, json={}, timeout=10)
        assert response.status_code == 501 and route in response.json()["detail"], response.text
        assert response.headers["x-should-retry"] == "false"
    wrong = httpx.post(service.base_url + "/api/v1/create_session", json={}, timeout=10,
                       headers={"X-API-Key": "tml-wrong"})
    assert wrong.status_code == 401
    training = client.create_lora_training_client(base_model=str(folder), rank=RANK).result()
    with pytest.raises(tinker.RequestFailedError, match="/api/v1/save_weights_external is not implemented"):
        training.save_weights_external("elsewhere").result(timeout=30)


def test_a_wrong_model_or_rank_is_refused_with_the_fix(served):
    _, _, client, folder, _ = served
    with pytest.raises(tinker.RequestFailedError, match=r"policy.lora_cfg.dim=8"):
        client.create_lora_training_client(base_model=str(folder), rank=8).result(timeout=30)
    with pytest.raises(tinker.RequestFailedError, match="is not this service's model"):
        client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=RANK).result(timeout=30)


def test_a_second_client_is_refused_while_the_first_is_alive(served):
    _, service, client, folder, _ = served
    client.create_lora_training_client(base_model=str(folder), rank=RANK).result()  # the first holds the session
    second = tinker.ServiceClient(base_url=service.base_url, api_key=service.api_key)
    with pytest.raises(tinker.ConflictError, match="one client at a time"):
        second.create_lora_training_client(base_model=str(folder), rank=RANK)


def test_the_service_listens_on_loopback_unless_told_otherwise(served):
    session, service, *_ = served
    assert service.host == "127.0.0.1"
    bound = {s.getsockname()[0] for server in service._server.servers for s in server.sockets}
    assert bound == {"127.0.0.1"}
    from rlkit.cli import build_parser

    assert build_parser().parse_args(["serve-tinker", "quickstart_nano"]).host == "127.0.0.1"
    with pytest.warns(UserWarning, match="beyond this machine"):
        TinkerService(session, host="0.0.0.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TinkerService(session)  # loopback: no warning


def test_client_sessions_free_the_slot_when_finished_or_silent():
    from rlkit.tinker_api.service import ClientSessions

    sessions = ClientSessions(timeout_s=60)
    first = sessions.open()
    with pytest.raises(RuntimeError, match=f"session {first} is active"):
        sessions.open()
    sessions.finish(first)
    second = sessions.open()
    assert second != first and not sessions.touch(first) and sessions.touch(second)
    silent = ClientSessions(timeout_s=0.0)
    silent.open()
    silent.open()  # the first stopped heartbeating: its slot is free
