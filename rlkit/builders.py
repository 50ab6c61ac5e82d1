"""Builders: a validated run config -> the session's objects (the one place that maps settings to classes), and
what is rebuilt when ``configure()`` or ``reset()`` changes the config (:data:`REBUILDS`)."""

from __future__ import annotations

from pathlib import Path
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

from rlkit import rng
from rlkit.algorithms import RLLoss
from rlkit.config.changes import Change, changes_needed, refusals
from rlkit.config.components import ColocatedConfig
from rlkit.config.loading import load_config, parse_overrides
from rlkit.config.run import RunConfig
from rlkit.data import load_prompt_dataset
from rlkit.envs import RewardFunctionEnvironment, make_environment
from rlkit.envs.judge import RewardComponent, WeightedRewards
from rlkit.envs.registry import load_reward_fn, reward_fn_path
from rlkit.errors import CheckpointError, ConfigError
from rlkit.generation.base import Generator
from rlkit.generation.engines import in_process_generator
from rlkit.generation.openai_server import OpenAIEndpoint
from rlkit.memory.plan import GIB, kv_cache_bytes
from rlkit.models import make_model, read_hf_config
from rlkit.models.pretrained import PRETRAINED, get_model
from rlkit.models.vocabulary import check_tokenizer_fits
from rlkit.policy.architecture import load_hf_state
from rlkit.run.components import Components
from rlkit.run.run import Run, needs_reference
from rlkit.run.state import RunState
from rlkit.stages.conversations import rollout_tools
from rlkit.stages.settings import RolloutSettings
from rlkit.startup import generator_engine, policy_engine
from rlkit.weight_sync import (BroadcastReceiver, BroadcastWeightSync, ColocatedWeightSync, Handoff,
                               RanksBroadcastWeightSync, SharedWeights, WeightSync, before_engine_starts)


def build_components(config: RunConfig, start: Any, env: Any = None, loss_fn: Optional[Callable] = None) -> Components:
    """Every component of ``config``, each timed as a part of ``start`` (a :class:`rlkit.startup.StartupReport`);
    ``env`` and ``loss_fn``, when given, are used instead of the config's."""
    from transformers import AutoTokenizer  # imported on first use: it loads a thousand modules

    with start.part("model folder"):
        ensure_model(config)
    with start.part("tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(config.policy.model_name)
        check_tokenizer_fits(tokenizer, config.policy.model_name)  # before either engine starts
    with start.part("environment"):
        env_from_config = env is None
        env = build_environment(config) if env_from_config else env
    with start.part("data"):  # a prompt's length counts the JSON tools its rollout renders (as the rollout picks them)
        tools = rollout_tools(env, RolloutSettings.from_config(config))
        dataset = load_prompt_dataset(config.data, tokenizer, config.policy.max_prompt_tokens, tools)
        if config.sft.enabled and config.sft.num_steps:  # the columns are known now, the engines not yet started
            check_sft_columns(config, dataset)
    with start.part("policy", engine=policy_engine(config)):
        policy = build_policy(config)
        before_engine_starts(policy)  # (policy.lora_cfg) a frozen base out while generating leaves first
    with start.part("generator", engine=generator_engine(config)):
        generator, weight_sync = build_generation(config, policy)
    loss_fn = loss_fn if loss_fn is not None else build_loss(config)
    policy.keep_reference(needs_reference(loss_fn))  # a reference copy only if the loss reads one
    critic = None
    if config.critic.enabled:
        with start.part("critic"):
            critic = build_critic(config)
    teacher = None
    if config.distillation.enabled:
        with start.part("teacher"):
            teacher = build_teacher(config)
    return Components(tokenizer, dataset, env, policy, generator, weight_sync, Handoff(policy, generator), loss_fn,
                      config_env=env if env_from_config else None, critic=critic, teacher=teacher)


def build_teacher(config: RunConfig) -> Any:
    """The frozen distillation teacher on the policy's backend (:mod:`rlkit.policy.teacher`: its tokenizer checked
    against the student's first), or None without ``distillation.enabled``."""
    if not config.distillation.enabled:
        return None
    from rlkit.policy.teacher import build_teacher as frozen_teacher

    return frozen_teacher(config.policy, config.distillation.teacher_model_name, config.seed)


def build_loss(config: RunConfig) -> RLLoss:
    """The loss of ``loss_fn.*``; KL folded into the reward (``grpo.reward_kl_coef`` > 0) needs the reference too."""
    return RLLoss(config.loss_fn, kl_in_reward=config.grpo.reward_kl_coef > 0)


def start_endpoint(components: Components, config: RunConfig, sampling: Any) -> Any:
    """The session's OpenAI-compatible endpoint over its generator (:mod:`rlkit.generation.openai_server`), started
    on 127.0.0.1 on the first call; the engine's length and ``data.chat_template_kwargs`` come from ``config``."""
    if components.endpoint is None:
        components.endpoint = OpenAIEndpoint(components.generator, components.tokenizer, sampling,
                                             max_model_len=config.policy.max_model_len,
                                             template_kwargs=config.data.chat_template_kwargs).start()
    return components.endpoint


def ensure_model(config: RunConfig) -> Path:
    """The model folder; created from ``policy.model_preset`` when it does not exist yet (a pretrained model is
    converted from its package then, :func:`rlkit.models.pretrained.get_model`)."""
    path, preset = Path(config.policy.model_name), config.policy.model_preset
    if not (path / "config.json").is_file() and preset in PRETRAINED:
        get_model(preset, path)
    elif not (path / "config.json").is_file() and preset is not None:
        make_model(path, preset, config.policy.model_family, seed=config.seed, tokenizer=config.policy.model_tokenizer)
    read_hf_config(path)  # clear error if it is still missing or unsupported
    return path


def _in_workers(config: RunConfig) -> bool:
    """Whether the policy runs in a Ray worker group (several ranks, or a Ray cluster to join)."""
    return config.policy.num_workers > 1 or config.policy.ray_address is not None


def build_policy(config: RunConfig):
    """The config's backend in this process (:mod:`rlkit.policy.backends`), or a Ray worker group of it."""
    p = config.policy
    if _in_workers(config):
        from rlkit.policy.workers import RayPolicyGroup

        return RayPolicyGroup(p, p.num_workers, seed=config.seed, ray_address=p.ray_address)
    from rlkit.policy.backends import in_process_policy

    return in_process_policy(p, seed=config.seed)


def build_generation(config: RunConfig, policy: Optional[Any] = None) -> tuple[Generator, WeightSync]:
    """The generator and the weight sync that refits it, built as one pair from one setting: an engine on the
    policy's own weights (Megatron-Core's, ``policy``'s model) moves nothing at a refit; an engine in
    this process (vLLM, or transformers' ``generate``) takes tensors directly; a vLLM engine in its own Ray
    actor (``policy.generation.colocated.enabled=false``, and unset with async GRPO) gets them by broadcast,
    from a sync that talks to that actor and no other: sent by this process, or by the policy's rank 0 when
    the policy runs in Ray workers."""
    p, colocated = config.policy, config.generation_colocated
    kv_gib = kv_cache_bytes(config, read_hf_config(p.model_name, check_weights=False)) / GIB  # "auto" resolved
    g = p.generation.model_copy(update={"colocated": ColocatedConfig(enabled=colocated), "vllm_cfg":
                                        p.generation.vllm_cfg.model_copy(update={"kv_cache_space_gib": kv_gib})})
    engine = dict(max_model_len=p.max_model_len, seed=config.seed)
    bucket_bytes = g.refit_bucket_size_mb * 1e6
    if colocated:  # an engine in this process takes tensors directly (validation keeps hf and megatron here)
        sync = SharedWeights() if g.engine.on_policy_weights else ColocatedWeightSync()
        return in_process_generator(p.model_name, g, **engine, policy=policy), sync
    from rlkit.generation.remote import RemoteGenerator

    generator = RemoteGenerator(p.model_name, g, **engine, ray_address=p.ray_address,
                                actor_extension=BroadcastReceiver)
    return generator, (RanksBroadcastWeightSync if _in_workers(config) else BroadcastWeightSync)(
        generator, bucket_bytes)


def build_environment(config: RunConfig):
    """``env.reward_fn`` (a function of yours by import path) wrapped as an environment, else ``env.name``'s."""
    if config.env.rewards:
        return WeightedRewards([RewardComponent(load_reward_fn(c.fn) if c.fn else make_environment(c.env), c.weight,
                                                c.name or c.env or c.fn.partition(":")[2])
                                for c in config.env.rewards])
    if config.env.reward_fn is not None:
        return RewardFunctionEnvironment(load_reward_fn(config.env.reward_fn))
    if config.env.name == "math":
        return make_environment("math", timeout_seconds=config.env.math_timeout_s)
    if config.env.answer_from != "completion":  # the config allows it only for the environments that read it
        return make_environment(config.env.name, answer_from=config.env.answer_from)
    return make_environment(config.env.name)


def environment_record(env: Any, config_env: Any) -> dict[str, Any]:
    """What a checkpoint keeps of a session's environment (``config_env``: the one the config built, if any) so that
    :func:`saved_environment` can build it again: that the config built it (``env.name``, ``env.reward_fn``), else
    its reward function's import path when it has one, and its repr for the error when it has none."""
    if env is not None and env is config_env:
        return {"from_config": True}
    fn = reward_fn_path(env.fn) if isinstance(env, RewardFunctionEnvironment) else None
    return {"from_config": False, "reward_fn": fn, "repr": repr(env)[:200]}


def saved_environment(state: Mapping[str, Any], path: str | Path) -> Any:
    """The environment a checkpoint's session used (its ``state.json``'s ``extra.environment``), built again; None
    for the config's (also for a checkpoint that does not say); CheckpointError with the fix for one of yours that
    cannot be imported again."""
    record = state.get("extra", {}).get("environment")
    if not record or record.get("from_config"):
        return None
    if record.get("reward_fn"):
        return RewardFunctionEnvironment(load_reward_fn(record["reward_fn"]))
    raise CheckpointError(
        f"{state['folder']} was saved by a session with an environment of yours, {record.get('repr')}, which a "
        "checkpoint cannot build again (its reward function is defined in a notebook or __main__, or it is not a "
        f"reward function). Fix: pass it again, Session.load({str(path)!r}, env=...), or put the reward function in "
        "a module and name it in the config (env.reward_fn: module:function)")


def check_sft_columns(config: RunConfig, dataset: Any) -> None:
    """SFT trains on the train split's ``sft.response_key`` column (after the prompt rendered with the chat template,
    loss on the answer and EOS only: :mod:`rlkit.data.sft`). Refuse, naming the columns the data has and the fix,
    when the column is not there: checked once the data is loaded (a file's or dataset's columns are not known
    before), ahead of the engines."""
    key, columns = config.sft.response_key, list(dataset["train"].column_names)
    if key in columns:
        return
    d = config.data
    source = (f"data.path={d.path!r}" if d.path is not None else f"data.dataset_name={d.dataset_name!r}"
              if d.dataset_name is not None else f"data.task={d.task!r}")
    others = [c for c in columns if c != "prompt"]
    fix = (f"set sft.response_key to the answer column (sft.response_key={others[0]}), or "
           f"data.answer_key={others[0]} to read it as 'answer'" if others else "add an answer column to the data")
    raise ConfigError([f"sft.response_key={key!r}: the SFT warm start trains on the train data's {key!r} column, and "
                       f"{source} has none (its columns: {', '.join(columns)}). Fix: {fix}; or sft.enabled=false "
                       "(RL only)"])


def _new_loss(run: Run, old: RunConfig, keys: list[str]) -> None:
    """The RLLoss of the new config, if the loss is the RLLoss of ``old``'s ``loss_fn``; any other loss (given to
    the constructor or assigned) is the user's: it is kept, and a warning says so."""
    if type(run.loss_fn) is RLLoss and run.loss_fn.params == old.loss_fn:
        run.loss_fn = build_loss(run.config)
        run.policy.keep_reference(needs_reference(run.loss_fn))
        return
    warnings.warn(f"{', '.join(keys)} changed, but this session trains with a loss function you supplied "
                  f"({run.loss_fn!r}); it is kept and does not read the config, so the change does not "
                  "reach it (assign session.loss_fn to replace it)", stacklevel=4)


def _new_run(run: Run, old: RunConfig, keys: list[str]) -> None:
    """``reset()``: the model folder's weights in the policy (and with adapters, the adapters as they started; also
    its reference), then in the generator; a new optimizer and schedule; a fresh run state and rollout source; the
    RNGs seeded as at construction."""
    new, policy = run.config, run.policy
    policy.load_hf_state(load_hf_state(new.policy.model_name))
    policy.reset_adapters()
    run.start(RunState.fresh(new, run.components.dataset))  # no warm start: the one below is the RL optimizer
    run.new_optimizer()
    policy.set_reference_to_current()
    policy.version = 0
    run.refit()
    rng.seed(new.seed)  # as at construction: python, numpy, torch and a live backend's tracker


def build_critic(config: RunConfig) -> Any:
    """PPO's critic (:class:`rlkit.policy.critic.Critic`) on ``critic.model_name`` or the policy's folder, or None
    without ``critic.enabled``."""
    if not config.critic.enabled:
        return None
    from rlkit.policy.critic import Critic

    from rlkit.policy.value_model import beside_the_policy

    return Critic(config.critic.model_name or config.policy.model_name, config.critic, config.seed,
                  beside_the_policy(config.policy))


# the models a MODELS change builds: the component, the config section that asks for it, its builder
_MODELS = (("critic", "critic", build_critic), ("teacher", "distillation", build_teacher))


def _new_models(run: Run, old: RunConfig, keys: list[str]) -> None:
    """``critic.enabled``, ``distillation.enabled`` or their folders changed: what the new config names is built
    (a teacher's tokenizer checked) before what it replaces is released; a refusal leaves the session and its config
    as they were (this action runs first of all)."""
    built = {}
    try:
        for part, section, build in _MODELS:
            if any(key.startswith(section + ".") for key in keys):
                built[part] = build(run.config)
    except BaseException:
        for model in built.values():
            if model is not None:
                model.close()
        run.config = old
        raise
    for part, model in built.items():
        if getattr(run.components, part) is not None:
            getattr(run.components, part).close()
        setattr(run.components, part, model)


# What a run rebuilds for each kind of change (LIVE: nothing; SESSION: refused), in this order.
REBUILDS: dict[Change, Callable[[Run, RunConfig, list[str]], None]] = {
    Change.MODELS: _new_models,
    Change.LOSS: _new_loss,
    Change.OPTIMIZER: lambda run, old, keys: run.new_optimizer(),
    Change.ROLLOUTS: lambda run, old, keys: run.start(run.state),
    Change.RUN: _new_run,
}


# A policy loss switched to by name brings the settings it is published with: its shipped preset's (ppo_clip: grpo.yaml)
LOSS_PRESETS = {"ppo_clip": "grpo", "gspo": "gspo"}
LOSS_COMPANION_KEYS = ("ratio_clip_min", "ratio_clip_max", "aggregation")


def loss_companions(config: RunConfig, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The companion settings that come with a switch of ``loss_fn.policy_loss`` in ``overrides`` (dotted keys):
    the clip range and aggregation of that loss's preset (:data:`LOSS_PRESETS`), for each key the overrides do not
    name themselves and whose value differs; ``{}`` for no switch, or a loss without a preset.

    Why applied rather than warned about: ``configure(["loss_fn.policy_loss=gspo"])`` reads as "train GSPO", and
    GSPO with PPO's clip (0.2) and token-mean aggregation is another algorithm; configure() prints every key it
    changed, and a value named in the same call wins, so nothing is hidden and any choice stays possible."""
    name = overrides.get("loss_fn.policy_loss")
    if not isinstance(name, str) or name == config.loss_fn.policy_loss or name not in LOSS_PRESETS:
        return {}
    preset = load_config(LOSS_PRESETS[name]).loss_fn
    return {f"loss_fn.{key}": getattr(preset, key) for key in LOSS_COMPANION_KEYS
            if f"loss_fn.{key}" not in overrides and getattr(preset, key) != getattr(config.loss_fn, key)}


def companions_note(old: RunConfig, overrides: Sequence[str] | Mapping[str, Any] | RunConfig) -> Optional[str]:
    """``configure()``'s line on the companion settings a switch of ``loss_fn.policy_loss`` brought, if any."""
    given = {} if isinstance(overrides, RunConfig) else parse_overrides(overrides)
    added = loss_companions(old, given)
    if not added:
        return None
    name = given["loss_fn.policy_loss"]
    return (f"  loss_fn.policy_loss={name} brought its companion settings from the {LOSS_PRESETS[name]} preset "
            f"({', '.join(f'{k}={v}' for k, v in added.items())}); name any of them in the same configure() call "
            "to keep another value")


def rebuild(run: Run, overrides: Sequence[str] | Mapping[str, Any] | RunConfig, where: str,
            refused: set[Change], always: Optional[Change] = None) -> dict[str, Change]:
    """``session.configure()`` and ``reset()``: take the config ``overrides`` gives and rebuild what its changes
    (and ``always``) need in ``run``, in :data:`REBUILDS`' order; a change ``where`` refuses raises ConfigError
    first, and nothing is changed. Returns each key's need."""
    if not isinstance(overrides, RunConfig):
        overrides = parse_overrides(overrides)
        overrides.update(loss_companions(run.config, overrides))
    new = overrides if isinstance(overrides, RunConfig) else load_config(run.config.model_dump(), overrides)
    changes = changes_needed(run.config, new)
    problems = refusals(changes, set(Change) - refused, where)
    if problems:
        raise ConfigError(problems)
    old, run.config = run.config, new
    needed = set(changes.values()) | ({always} if always else set())
    if Change.RUN in needed:
        needed -= {Change.OPTIMIZER, Change.ROLLOUTS}  # a new run makes both anew
    for change, action in REBUILDS.items():
        if change in needed:
            action(run, old, [key for key, c in changes.items() if c is change])
    return changes
