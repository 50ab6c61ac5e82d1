"""What each Tinker call does to the one Session behind the service: the Session's own stages, nothing beside them.

    create_model              checks the base model and LoRA rank against the session (refused with the override
                              that would match), sets ``session.loss_fn`` to :class:`TinkerLoss`; the policy's
                              weights stay as they are
    forward / forward_backward  the datums as a batch (:mod:`rlkit.tinker_api.convert`), ``session.logprobs(batch)``
                              (the per-token logprobs returned) and ``session.loss(batch)`` (the loss returned);
                              forward_backward keeps the batch for the next optim_step
    optim_step                the kept batches as one, Adam's parameters on the optimizer, ``session.train(batch)``:
                              one recorded step, in ``session.history`` like a step of the session's own
    save_weights_for_sampler  ``session.refit()`` (the generator gets the policy's weights)
    sample / compute_logprobs the session's generator; prompt logprobs from the policy (same weights after a save)

Why a forward_backward keeps its batch instead of its gradients: rlkit's train step is all or nothing (gradients,
clipping, update), and Tinker's losses are sums, so the gradient of the kept batches taken together is the sum of
their gradients, which is what Tinker accumulates. The weights do not change between the two calls, so the step's
forward sees what forward_backward saw.

Deliberate simplifications: one model (the session's policy) and one generator: a sampling client samples from the
weights of the latest save (older snapshots are not kept; sampling from one warns); a new training client trains the
session's policy as it is (Tinker's starts fresh adapters; here a policy that has trained keeps its weights and
optimizer state, so a notebook can hand its policy to a script; ``s.reset()`` gives fresh ones); clipping is the
session's ``policy.max_grad_norm`` (``rlkit serve-tinker`` starts with none, Tinker's default), a different
``grad_clip_norm`` warns; prompt logprobs come from the policy, not the engine.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import torch

from rlkit.generation.base import SamplingSettings
from rlkit.stages.train import one_update
from rlkit.tinker_api.convert import TinkerRequestError, datums_to_batch, per_datum, sampled_mismatch
from rlkit.tinker_api.losses import TinkerLoss, elementwise_loss
from rlkit.tinker_api.wire import ForwardBackwardCall, Sequence_, encode_forward_backward, encode_sample
from rlkit.trajectories import Trajectories

if TYPE_CHECKING:
    from rlkit.session import Session


@dataclass
class Sampler:
    """A sampling session: what it was made from and the policy version it was made at."""

    base_model: str
    model_path: Optional[str]
    version: int


@dataclass
class TinkerBackend:
    """The state a Tinker client builds up (its model, samplers, the batches since the last optim_step) over one
    Session. Its methods run on the service's one worker thread (:class:`rlkit.tinker_api.futures.FutureStore`)."""

    session: Session
    model_id: Optional[str] = None
    lora_rank: Optional[int] = None
    pending: list[Trajectories] = field(default_factory=list)
    samplers: dict[str, Sampler] = field(default_factory=dict)
    checkpoints: dict[str, int] = field(default_factory=dict)  # sampler path -> policy version
    previous_loss: Any = None
    models_made: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- the model ----------------------------------------------------------------------------------------
    @property
    def base_model(self) -> str:
        return str(self.session.config.policy.model_name)

    def model_names(self) -> list[str]:
        """The names create_model accepts: the session's model folder, as configured and resolved."""
        name = self.base_model
        return sorted({name, str(Path(name).resolve())})

    def create_model(self, base_model: str, lora: Optional[Mapping[str, Any]], optimizer: Mapping[str, Any],
                     model_id: Optional[str] = None) -> dict:
        config = self.session.config.policy
        if str(Path(base_model).resolve()) != str(Path(self.base_model).resolve()):
            raise TinkerRequestError(
                f"base_model {base_model!r} is not this service's model: it serves {self.base_model!r} (the session's "
                f"policy.model_name); pass that folder, or start the service with policy.model_name={base_model}")
        if (optimizer or {}).get("type", "adamw") != "adamw":
            raise TinkerRequestError(f"optimizer {optimizer.get('type')!r} is not served: rlkit's service trains with "
                                     "AdamW (types.AdamOptimizerConfig)")
        lora_cfg = config.lora_cfg
        if lora is None and lora_cfg.enabled:
            raise TinkerRequestError("full-weight training was asked for, but the session trains LoRA adapters: start "
                                     "the service with policy.lora_cfg.enabled=false")
        if lora is not None and (not lora_cfg.enabled or lora_cfg.dim != lora["rank"]):
            have = f"rank {lora_cfg.dim}" if lora_cfg.enabled else "full weights (no LoRA)"
            raise TinkerRequestError(f"LoRA rank {lora['rank']} was asked for, but the session trains {have}: start "
                                     f"the service with policy.lora_cfg.enabled=true "
                                     f"policy.lora_cfg.dim={lora['rank']}")
        if self.previous_loss is None:
            self.previous_loss = self.session.loss_fn
        self.session.loss_fn = TinkerLoss()
        self.models_made += 1
        self.model_id = model_id or f"rlkit-model-{self.models_made}"
        self.lora_rank = lora["rank"] if lora is not None else None
        self.pending.clear()
        return {"model_id": self.model_id, "type": "create_model"}

    def check_model(self, model_id: str) -> None:
        if self.model_id is None:
            raise TinkerRequestError("no model yet: create a training client first (create_lora_training_client)")
        if model_id != self.model_id:
            raise TinkerRequestError(f"unknown model_id {model_id!r}; this service's model is {self.model_id!r}")

    def info(self, model_id: str) -> dict:
        self.check_model(model_id)
        config = self.session.config.policy
        return {"type": "get_info", "model_id": model_id, "model_name": self.base_model,
                "is_lora": self.lora_rank is not None, "lora_rank": self.lora_rank,
                "model_data": {"arch": config.model_family, "model_name": self.base_model,
                               "tokenizer_id": str(Path(self.base_model).resolve())}}

    # ---- training -----------------------------------------------------------------------------------------
    def forward_backward(self, call: ForwardBackwardCall) -> bytes:
        self.check_model(call.model_id)
        numbers = {k: v for k, v in call.loss_fn_config.items() if not isinstance(v, str)}
        batch = datums_to_batch(call.data, call.loss_fn, numbers, self.session.tokenizer.pad_token_id,
                                self.session.policy.version)
        with warnings.catch_warnings():  # the stage's figure counts the prompt's positions too: see sampled_mismatch
            warnings.filterwarnings("ignore", message="generator and trainer logprobs disagree")
            batch = self.session.logprobs(batch)
        batch = sampled_mismatch(batch, self.session.config.grpo.mismatch_warning_threshold)
        loss = self.session.loss(batch).metrics["loss"]
        terms = elementwise_loss(batch.prev_logprobs, batch)
        outputs = [{"logprobs": lp, "elementwise_loss": el}
                   for lp, el in zip(per_datum(batch.prev_logprobs, batch), per_datum(terms, batch))]
        if not call.forward_only:
            self.pending.append(batch)
        return encode_forward_backward(outputs, {"loss:sum": loss})

    def optim_step(self, model_id: str, adam: Mapping[str, float]) -> dict:
        self.check_model(model_id)
        if not self.pending:
            raise TinkerRequestError("no forward_backward since the last optim_step: there is no gradient to apply")
        batch = Trajectories.concat(self.pending) if len(self.pending) > 1 else self.pending[0]
        train = self.session.settings.train
        if not one_update(batch.batch_size, train.num_epochs, train.global_batch_size):
            raise TinkerRequestError(
                f"the session's training settings take several steps over {batch.batch_size} datums (grpo.num_epochs="
                f"{train.num_epochs}, policy.train_global_batch_size={train.global_batch_size}); Tinker's optim_step "
                "is one: start the service with grpo.num_epochs=1 and no policy.train_global_batch_size")
        lr = apply_adam(self.session, adam)
        metrics = self.session.train(batch, allow_reuse=True)
        # the policy reports its schedule's rate, but this step used Tinker's: the history says what was used
        metrics.values["train/learning_rate"] = lr
        self.pending.clear()
        return {"type": "optim_step", "metrics": {"loss:sum": float(metrics.values["train/loss"]),
                                                  "learning_rate:mean": lr,
                                                  "grad_norm:mean": float(metrics.values["train/grad_norm"])}}

    # ---- checkpoints: save_state / load_state as the Session's own checkpoints ----------------------------
    def checkpoint_folder(self, name: str) -> Path:
        """Where ``save_state(name)`` writes: ``<logger.log_dir>/tinker_checkpoints/<name>``."""
        if not name or "/" in name or name in (".", ".."):
            raise TinkerRequestError(f"checkpoint name {name!r}: a plain name, no slashes")
        return Path(self.session.config.logger.log_dir) / "tinker_checkpoints" / name

    def save_state(self, model_id: str, name: Optional[str], overwrite: bool) -> dict:
        """``session.save(folder)``: weights, optimizer, schedule, run state and RNG, as any rlkit checkpoint."""
        self.check_model(model_id)
        name = name or f"step-{self.session.policy.version}"
        folder = self.checkpoint_folder(name)
        if folder.exists() and not overwrite:
            raise TinkerRequestError(f"checkpoint {name!r} exists ({folder}); save_state with another name")
        self.session.save(folder)
        return {"type": "save_weights", "path": f"tinker://{model_id}/weights/{name}"}

    def load_state(self, request: Mapping[str, Any]) -> dict:
        """``session.restore(folder)`` (weights, optimizer, run state; the generator refit); without ``optimizer`` a
        fresh AdamW after it, as Tinker's weights-only load leaves. A request without a ``model_id`` is
        ``ServiceClient.create_training_client_from_state``: a new model (the session's, its LoRA rank) first, under
        the id the SDK composes (``<session_id>:train:<model_seq_id>``)."""
        path, optimizer = request["path"], bool(request.get("optimizer"))
        name = path.rstrip("/").rsplit("/weights/", 1)[-1] if path.startswith("tinker://") else None
        folder = self.checkpoint_folder(name) if name else None
        if folder is None or not folder.is_dir():
            raise TinkerRequestError(f"unknown checkpoint {path!r}: load_state takes a path save_state returned on this "
                                     "service (tinker://MODEL/weights/NAME)")
        model_id = request.get("model_id")
        if model_id is None:
            lora = self.session.config.policy.lora_cfg
            model_id = f"{request['session_id']}:train:{request['model_seq_id']}"
            self.create_model(request.get("base_model") or self.base_model, {"rank": lora.dim} if lora.enabled else None,
                              request.get("optimizer_config") or {}, model_id=model_id)
        self.check_model(model_id)
        self.session.restore(folder)
        if not optimizer:
            self.session.current.new_optimizer()
        self.pending.clear()
        return {"type": "load_weights", "path": path, "model_id": model_id}

    # ---- sampling -----------------------------------------------------------------------------------------
    def save_for_sampler(self, model_id: str, path: Optional[str], seq_id: Optional[int]) -> dict:
        self.check_model(model_id)
        if self.session.stale:
            self.session.refit()
        version = self.session.policy.version
        if path is not None:
            uri = f"tinker://{model_id}/sampler_weights/{path}"
            self.checkpoints[uri] = version
            return {"type": "save_weights_for_sampler", "path": uri}
        sampler_id = self.new_sampler(self.base_model, None, version)
        return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}

    def new_sampler(self, base_model: Optional[str], model_path: Optional[str], version: Optional[int]) -> str:
        if model_path is not None and model_path not in self.checkpoints:
            raise TinkerRequestError(f"unknown model_path {model_path!r}: this service knows "
                                     f"{sorted(self.checkpoints) or 'no saved sampler weights yet'}")
        if version is None:
            version = self.checkpoints[model_path] if model_path is not None else 0
        with self._lock:
            sampler_id = f"sampler-{len(self.samplers) + 1}"
            self.samplers[sampler_id] = Sampler(base_model or self.base_model, model_path, version)
        return sampler_id

    def sampler(self, sampler_id: str) -> Sampler:
        if sampler_id not in self.samplers:
            raise TinkerRequestError(f"unknown sampling session {sampler_id!r}")
        return self.samplers[sampler_id]

    def sample(self, sampler_id: str, prompt: Sequence[int], num_samples: int, params: Mapping[str, Any],
               prompt_logprobs: bool) -> bytes:
        sampler = self.sampler(sampler_id)
        if self.session.generator_version < 0:
            self.session.refit()  # the engine let go of its weights for a policy pass: the policy's come back
        if sampler.version != self.session.generator_version:
            warnings.warn(f"sampling session {sampler_id} was saved at policy version {sampler.version}, but the "
                          f"engine holds version {self.session.generator_version}: rlkit's service keeps one set of "
                          "sampler weights, the latest save's", stacklevel=1)
        if not prompt:
            raise TinkerRequestError("the prompt is empty")
        settings, stop_ids = sampling_settings(params, self.session.sampling())
        generation = self.session.generator.generate([list(prompt)], num_samples, settings)
        sequences = [_cut_at_stop(tokens, logprobs, reason, stop_ids) for tokens, logprobs, reason in
                     zip(generation.token_ids, generation.logprobs, generation.finish_reasons)]
        prompt_values = self.prompt_logprobs(prompt) if prompt_logprobs else None
        return encode_sample(sequences, prompt_values)

    def prompt_logprobs(self, prompt: Sequence[int]) -> list[float]:
        """The policy's logprob of each prompt token given the ones before (NaN for the first)."""
        ids = torch.tensor([list(prompt)], dtype=torch.int64)
        scores = self.session.policy.logprobs(ids, torch.ones_like(ids, dtype=torch.bool))
        return [math.nan, *scores.logprobs[0, 1:].tolist()]

    def close(self) -> None:
        if self.previous_loss is not None:
            self.session.loss_fn = self.previous_loss
            self.previous_loss = None


def apply_adam(session: Session, adam: Mapping[str, float]) -> float:
    """Tinker's per-step Adam parameters on the policy's AdamW (its moments kept): lr, betas, eps, weight decay; the
    session's schedule is not applied (Tinker's script sets the rate each step). Returns the rate. The step's
    clipping is the session's ``policy.max_grad_norm``; a ``grad_clip_norm`` that differs warns."""
    for group in session.policy.optimizer.param_groups:
        group["lr"] = float(adam.get("learning_rate", 1e-4))
        group["betas"] = (float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95)))
        group["eps"] = float(adam.get("eps", 1e-12))
        group["weight_decay"] = float(adam.get("weight_decay", 0.0))
    clip = float(adam.get("grad_clip_norm", 0.0)) or None
    if clip != session.config.policy.max_grad_norm:
        warnings.warn(f"optim_step asked for grad_clip_norm={clip or 0.0}, but the session clips at "
                      f"policy.max_grad_norm={session.config.policy.max_grad_norm} (start the service with "
                      "policy.max_grad_norm="
                      f"{clip if clip else 'null'} to match)", stacklevel=1)
    return float(adam.get("learning_rate", 1e-4))


def sampling_settings(params: Mapping[str, Any], default: SamplingSettings) -> tuple[SamplingSettings, set[int]]:
    """Tinker's ``SamplingParams`` as the generator's settings, and the stop token ids (cut after sampling)."""
    stop = params.get("stop")
    strings: tuple[str, ...] = ()
    ids: set[int] = set()
    if isinstance(stop, str):
        strings = (stop,)
    elif stop is not None:
        if len(stop) == 0:
            raise TinkerRequestError("stop=[] (no stop at all, EOS included) is not served: rlkit's engine always "
                                     "stops at EOS")
        strings = tuple(s for s in stop if isinstance(s, str))
        ids = {int(s) for s in stop if not isinstance(s, str)}
    top_k = params.get("top_k", -1)
    max_tokens = params.get("max_tokens")
    return SamplingSettings(temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                            top_k=None if top_k is None or top_k < 0 else int(top_k),
                            max_new_tokens=int(max_tokens) if max_tokens is not None else default.max_new_tokens,
                            stop_strings=strings, seed=params.get("seed")), ids


def _cut_at_stop(tokens: Sequence[int], logprobs: Sequence[float], reason: str, stop_ids: set[int]) -> Sequence_:
    """A sample cut after its first stop token (the tokens after it never influence the ones before, so this is the
    sample a stop during generation gives)."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return Sequence_(list(tokens[:i + 1]), list(logprobs[:i + 1]), "stop")
    return Sequence_(list(tokens), list(logprobs), reason)

