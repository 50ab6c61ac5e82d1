"""The on-policy distillation teacher: a second model folder, loaded once on the policy's backend, frozen, that
scores the tokens the student sampled (:func:`rlkit.stages.teacher_logprobs`).

It is the training loop of :class:`rlkit.policy.in_process.InProcessPolicy` over the teacher's weights, never
stepped: its logprobs are the student's own code path (the same backend, microbatching, fused head and sampling
temperature), and its gradient buffers are released at once (a frozen model needs none). It runs in this process:
beside an in-process Megatron policy it shares the policy's parallel state
(:func:`rlkit.policy.megatron.parallel.init_parallel`); beside a policy in Ray workers (TP, PP, DP) it is one
process with no model parallelism, and only its logprobs travel.

The teacher must read token ids as the student writes them: :func:`check_same_tokenizer` compares the two
folders' tokenizers before any weight is loaded.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.config.components import PolicyConfig
from rlkit.errors import ModelError
from rlkit.models.factory import read_hf_config
from rlkit.policy.backends import in_process_policy
from rlkit.policy.in_process import InProcessPolicy


def check_same_tokenizer(student: str | Path, teacher: str | Path) -> None:
    """Raise ``ModelError`` unless the tokenizers of the ``student`` and ``teacher`` model folders map every token
    to the same id (vocabulary, added tokens, special tokens) and the teacher's embedding has a row for each."""
    from transformers import AutoTokenizer  # imported on first use: it loads a thousand modules

    if not (Path(teacher) / "config.json").is_file():
        raise ModelError(f"distillation.teacher_model_name={str(teacher)!r}: no model folder there (no config.json). "
                         "Train or make the teacher first (the distill_quickstart preset's: rlkit train --export "
                         "models/quickstart-teacher quickstart), or name another folder")
    read_hf_config(teacher, check_weights=False)  # an unsupported or broken folder: its own clear error
    ours, theirs = AutoTokenizer.from_pretrained(str(student)), AutoTokenizer.from_pretrained(str(teacher))
    problems = []
    a, b = ours.get_vocab(), theirs.get_vocab()
    if a != b:
        differ = sorted({t for t in a.keys() ^ b.keys()} | {t for t in a.keys() & b.keys() if a[t] != b[t]})
        problems.append(f"{len(differ)} token(s) are missing from one vocabulary or have another id "
                        f"(sizes {len(a)} and {len(b)}; e.g. {differ[:5]})")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(ours, name) != getattr(theirs, name):
            problems.append(f"{name}: {getattr(ours, name)} (student) vs {getattr(theirs, name)} (teacher)")
    if problems:
        raise ModelError(
            f"distillation.teacher_model_name={str(teacher)!r}: its tokenizer differs from the student's "
            f"({str(student)!r}): " + "; ".join(problems) + ". The teacher scores the student's token ids, so both must "
            "use one tokenizer. Fix: a teacher trained from the same base (or made with the same "
            "policy.model_tokenizer), or the student's tokenizer saved into the teacher's folder if it was trained "
            "with it")
    vocab = read_hf_config(teacher, check_weights=False).get("vocab_size")
    if vocab is not None and len(ours) > vocab:
        raise ModelError(f"distillation.teacher_model_name={str(teacher)!r}: its embedding has {vocab} rows but the "
                         f"student's tokenizer has {len(ours)} tokens; the teacher cannot score every id the student "
                         "writes. Fix: a teacher whose vocab_size covers the student's tokenizer")


def build_teacher(policy: PolicyConfig, teacher: str | Path, seed: int = 0) -> InProcessPolicy:
    """The frozen teacher on ``policy``'s backend, in this process: the folder ``teacher`` (tokenizer checked
    first), full weights (no adapters), gradient buffers released. Beside an in-process policy it takes the policy's
    layout (and shares Megatron's parallel state); beside a policy in Ray workers, one process's layout."""
    check_same_tokenizer(policy.model_name, teacher)
    section = policy.backend_section
    cfg = policy.model_copy(update={"model_name": str(teacher), "model_preset": None,
                                    "lora_cfg": policy.lora_cfg.model_copy(update={"enabled": False}),
                                    "num_workers": 1, "ray_address": None,
                                    f"{section.name}_cfg": section.single_process()})
    model = in_process_policy(cfg, seed)
    model.release_gradient_buffers()
    return model
