"""Session checkpoints: resume equals an uninterrupted run; interrupted writes leave the last checkpoint whole;
the HF export loads in transformers and vLLM with the policy's logprobs.

One session runs 2 RL steps, saves, runs 2 more (the reference), then tries to overwrite the checkpoint with
a write that fails halfway; a second session loads the checkpoint and runs the same 2 steps.
Resume tolerance: rel 1e-6 / abs 1e-7 on every non-timing metric (CPU fp32; observed: bit-identical).
"""

import hashlib
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from rlkit.session import Session
from rlkit.tracking import checkpoint
from tests.tracking.conftest import deterministic, tiny_config

STEPS_BEFORE, STEPS_AFTER = 2, 2


def values(metrics):
    return deterministic(metrics.values)


def file_digests(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def first_run(warm_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checkpoint")
    # a KL penalty and a warm-up make the reference weights and the schedule matter to the metrics
    cfg = tiny_config(warm_model, tmp, "loss_fn.reference_policy_kl_penalty=0.05", "policy.scheduler.warmup_steps=10")
    ckpt = tmp / "ckpt"
    with Session(cfg) as s:
        for _ in range(STEPS_BEFORE):
            s.step()
        t0 = time.perf_counter()
        s.save(ckpt)
        save_seconds = time.perf_counter() - t0
        saved_weights = s.policy.hf_state_dict()
        saved_history = [values(m) for m in s.history]
        later = [values(s.step()) for _ in range(STEPS_AFTER)]
        digests = file_digests(ckpt)

        def fail(*args, **kwargs):  # state.json is written last: every tensor file is already on disk
            raise OSError("disk full (simulated)")

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(checkpoint, "_json_dump", fail)
            with pytest.raises(OSError, match="simulated"):
                s.save(ckpt)
        after_failure = file_digests(ckpt)
        leftovers = [p.name for p in tmp.iterdir() if p.name.startswith(".")]
        export = s.export_hf(tmp / "hf")
        batch = s.batch
        policy_logprobs = s.policy.logprobs(batch.input_ids, batch.attention_mask).logprobs
    return SimpleNamespace(cfg=cfg, ckpt=ckpt, tmp=tmp, saved_weights=saved_weights, saved_history=saved_history,
                           later=later, digests=digests, after_failure=after_failure, leftovers=leftovers,
                           save_seconds=save_seconds, export=export, batch=batch, policy_logprobs=policy_logprobs)


def test_failed_or_killed_overwrite_leaves_the_previous_checkpoint_intact(first_run):
    assert first_run.after_failure == first_run.digests
    assert first_run.leftovers == []  # the partial temporary folder was removed

    # SIGKILL a process in the middle of writing a large checkpoint over the same folder
    writer = (
        "import sys, torch\n"
        "from safetensors.torch import save_file\n"
        "from rlkit.tracking.checkpoint import write_atomically\n"
        "def write(tmp):\n"
        "    for i in range(200):\n"
        "        save_file({'x': torch.full((4 * 2**20,), float(i))}, str(tmp / f'part{i}.safetensors'))\n"
        "        print(i, flush=True)\n"
        "write_atomically(sys.argv[1], write)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer, str(first_run.ckpt)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # three 16 MB files written, the rename still far away
            assert proc.stdout.readline(), "the writer exited early"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    partial = [p for p in first_run.tmp.iterdir() if p.name.startswith(".ckpt.tmp-")]
    assert len(partial) == 1 and len(list(partial[0].iterdir())) >= 3
    assert file_digests(first_run.ckpt) == first_run.digests
    assert checkpoint.resolve_checkpoint(first_run.ckpt) == first_run.ckpt
    assert checkpoint.clean_stale_temporaries(first_run.tmp) == partial  # the writer is dead: cleaned


def test_loaded_session_continues_exactly_like_the_uninterrupted_run(first_run):
    info = checkpoint.CheckpointInfo.read(first_run.ckpt)
    params = sum(t.numel() for t in first_run.saved_weights.values())
    assert info.step_count == info.policy_version == STEPS_BEFORE
    assert 16 * params < info.size_bytes < 16 * params + 200_000  # weights + reference + 2 Adam moments, fp32
    with Session.load(first_run.ckpt) as s:
        assert s.step_count == STEPS_BEFORE and s.policy.version == STEPS_BEFORE and not s.stale
        assert [values(m) for m in s.history] == first_run.saved_history
        for name, tensor in s.policy.hf_state_dict().items():
            assert torch.equal(tensor, first_run.saved_weights[name]), name
        resumed = [values(s.step()) for _ in range(STEPS_AFTER)]
    assert any(m["train/grad_norm"] > 0 and m["rollout/reward_std"] > 0 for m in resumed)  # real learning signal
    assert any(m["train/kl"] > 0 for m in resumed)  # the reference weights are in play
    for got, want in zip(resumed, first_run.later):
        assert got.keys() == want.keys()
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7)


def test_load_refuses_a_truncated_checkpoint(first_run, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(first_run.ckpt, broken)
    shard = next((broken / "policy" / "shards").glob("*.safetensors"))
    with open(shard, "r+b") as f:
        f.truncate(100)
    with pytest.raises(checkpoint.CheckpointError, match="truncated"):
        Session.load(broken)


def test_exported_folder_matches_policy_logprobs_in_transformers_and_vllm(first_run):
    from transformers import AutoModelForCausalLM

    from rlkit.generation.vllm import VllmGenerator

    batch, expected = first_run.batch, first_run.policy_logprobs
    valid = batch.attention_mask.clone()
    valid[:, 0] = False  # position 0 has no logprob
    assert valid.sum() > 100

    model = AutoModelForCausalLM.from_pretrained(first_run.export, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    hf = torch.zeros_like(expected)
    hf[:, 1:] = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    assert (hf - expected)[valid].abs().max() < 1e-3

    from vllm import SamplingParams

    generator = VllmGenerator(first_run.export, first_run.cfg.policy.generation, max_model_len=64)
    try:
        rows = [ids[mask].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask)]
        outputs = generator.llm.generate([{"prompt_token_ids": r} for r in rows],
                                         SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    finally:
        generator.close()
    worst = 0.0
    for i, (row, out) in enumerate(zip(rows, outputs)):
        for t in range(1, len(row)):
            worst = max(worst, abs(out.prompt_logprobs[t][row[t]].logprob - expected[i, t].item()))
    assert worst < 1e-3, worst
