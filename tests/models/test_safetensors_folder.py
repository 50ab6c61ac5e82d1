"""A sharded HF folder (index file, several shards), as real checkpoints come: the Megatron policy loads it one
layer at a time and the export writes the same shard layout back.

Memory bound: while ``load_hf_state`` runs, the process's resident memory grows by less than half the model's
bytes (the parameters themselves already exist), i.e. the weights are never held twice; loading the whole
folder into a dict first, as before, grew it by about the model's size again.
"""

import json
import threading
import time

import torch
from transformers import AutoModelForCausalLM

from rlkit.config.components import PolicyConfig
from rlkit.models.folder import INDEX_FILE
from rlkit.policy.factory import in_process_policy
from rlkit.policy.megatron.policy import load_hf_state
from rlkit.tracking.export import export_hf_folder


def resave_sharded(path, out, max_shard_size):
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.save_pretrained(str(out), max_shard_size=max_shard_size)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (path / name).is_file():
            (out / name).write_bytes((path / name).read_bytes())
    return out


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def peak_rss_growth(fn) -> int:
    """Peak resident memory above the level before ``fn()``, sampled every millisecond while it runs."""
    start, peak, done = rss_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], rss_bytes()) - start


def test_a_sharded_folder_loads_layer_by_layer_and_exports_in_its_own_layout(model_factory, tmp_path):
    sharded = resave_sharded(model_factory("small", "llama", seed=2), tmp_path / "sharded", "20MB")
    index = json.loads((sharded / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    hf = load_hf_state(sharded)
    model_bytes = sum(t.numel() * t.element_size() for t in hf.meta().values())
    assert model_bytes > 60e6  # ~20M fp32 parameters: large enough for the memory bound to mean something

    policy = in_process_policy(PolicyConfig(model_name=str(sharded)))
    try:
        ids = torch.randint(3, 100, (2, 32), generator=torch.Generator().manual_seed(0))
        reference = AutoModelForCausalLM.from_pretrained(str(sharded), dtype=torch.float32).eval()
        with torch.no_grad():
            policy.model.eval()
            assert (reference(ids).logits - policy.adapter.logits(ids)).abs().max() < 1e-4
        del reference

        growth = peak_rss_growth(lambda: policy.load_hf_state(load_hf_state(sharded)))
        print(f"load grew RSS by {growth / 1e6:.0f} MB for a {model_bytes / 1e6:.0f} MB model")
        assert growth < 0.5 * model_bytes, f"load grew RSS by {growth / 1e6:.0f} MB for a {model_bytes / 1e6:.0f} MB model"

        out = tmp_path / "export"
        out.mkdir()
        export_hf_folder(policy, sharded, out)
    finally:
        policy.close()
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    assert json.loads((out / INDEX_FILE).read_text())["weight_map"] == index["weight_map"]
    exported = load_hf_state(out)
    for name in hf:
        assert exported.file_of()[name] == hf.file_of()[name]
        assert torch.equal(exported[name], hf[name]), name
