"""Checkpoints of a whole session, written atomically and read without pickle.

A checkpoint is a folder::

    policy/                 the policy's own state (``Policy.save_state``): weights, KL reference, optimizer
                            and schedule as a distributed checkpoint, one safetensors shard per rank, and
                            policy.json (layout, version); see :mod:`rlkit.policy.state`
    rng.safetensors         torch CPU RNG (+ CUDA, + a backend's tracked RNG states: rlkit.rng) of this process
    config.yaml             the resolved run config
    state.json              the run state (``run_state``: RunState.state_dict(), i.e. step, sampler
                            position, the step's prompts, baseline, history), python/numpy RNG, caller's
                            ``extra``, the size of every file

Why atomic: a run that dies while writing (SIGKILL, out of memory, a full disk) must leave the last good
checkpoint loadable. Everything is written into a hidden sibling folder, each file fsynced, and only then
renamed into place (a rename within a directory is atomic on POSIX). Overwriting an existing folder takes
two renames (old aside, new in); a crash between them leaves the old one as ``.<name>.old-*``, which
:func:`resolve_checkpoint` falls back to. Periodic checkpoints never overwrite: each step has its own folder,
and pruning renames a folder away before deleting it, so a half-deleted folder never looks valid. A resume
takes the newest checkpoint that reads whole (:func:`resumable_checkpoint`, which warns about each damaged
newer one) or the one the user chose (:func:`chosen_checkpoint`).

Why no pickle: a checkpoint may come from someone else; safetensors and JSON cannot execute code.

Every backend saves, a Ray worker group included: each rank writes its shard into the same temporary folder
(one machine, or a file system every node shares), and the rename happens after all ranks are done.

Deliberate simplifications: a checkpoint resumes under the parallel layout it was written with (refused
with a clear message otherwise); take a checkpoint between stages (the
current step's prompts are kept, the in-flight batch is not: a resumed session re-draws the step's rollout,
which is the same rollout under the same seed and weights); the model folder named by the config must
still exist (it supplies the architecture, tokenizer and the generator's start-up weights).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import psutil
from safetensors.torch import load_file, save_file

from rlkit import rng
from rlkit.config.loading import config_to_yaml, load_config
from rlkit.config.run import RunConfig
from rlkit.errors import CheckpointError
from rlkit.policy.state import read_policy_meta
from rlkit.tracking.export import export_hf_folder

FORMAT = "rlkit-checkpoint"
POLICY_DIR = "policy"
CRITIC_DIR = "critic"  # PPO's value model (rlkit.policy.critic), when the run has one
FORMAT_VERSION = 3  # 3: the policy's state as a distributed checkpoint in policy/; 2: the run state under "run_state"
STEP_DIR = re.compile(r"^step_(\d+)$")


# ---- atomic folder writes -----------------------------------------------------------------------------
def fsync_path(path: Path) -> None:
    """Flush a file or a folder (its entries: a rename into it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_folder)``, fsync what it wrote, then put the folder at ``path`` by rename.

    If ``write`` raises (or the process dies) the folder at ``path``, if any, is untouched; the partial
    temporary folder is removed on an exception and ignored (then cleaned) after a crash.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        for file in tmp.rglob("*"):
            if file.is_file():
                fsync_path(file)
        fsync_path(tmp)
        old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}" if path.exists() else None
        if old is not None:
            os.rename(path, old)
        os.rename(tmp, path)
        fsync_path(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            fsync_path(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def clean_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove leftovers of writers that died (temporary folders of dead processes, pruned folders)."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        m = re.match(r"^\..+\.tmp-(\d+)-[0-9a-f]+$", entry.name)
        if (m and not psutil.pid_exists(int(m.group(1)))) or entry.name.startswith(".trash-"):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _json_dump(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=1))


# ---- save -----------------------------------------------------------------------------------------------
def save_checkpoint(path: str | Path, policy: Any, run_state: Any, config: RunConfig,
                    extra: Optional[Mapping[str, Any]] = None, critic: Any = None) -> Path:
    """Write a run to the folder ``path`` atomically (see the module docstring): the ``policy``'s state, the
    ``run_state`` (a :class:`rlkit.run.state.RunState`), the RNG states and ``config``; returns ``path``. The caller
    keeps async GRPO's producer off the sampler meanwhile (the run's ``rollouts.exclusive()``).

    Take it between steps or between stages; ``extra`` (JSON-able) is stored and returned by
    :func:`read_checkpoint_state` (the experiment runner keeps its before-RL accuracy there). PPO's ``critic``, when
    the run has one, is saved beside the policy (``CRITIC_DIR``).
    """
    if policy is None:
        raise CheckpointError("this session is closed: nothing to save")
    rng_tensors, rng_meta = rng.capture()
    state = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "saved_at": time.time(),
        "run_state": run_state.state_dict(),
        "rng": rng_meta,
        "extra": dict(extra or {}),
    }

    def write(folder: Path) -> None:
        policy.save_state(folder / POLICY_DIR)  # every rank writes its shard here
        if critic is not None:
            critic.save_state(folder / CRITIC_DIR)
        save_file(rng_tensors, str(folder / "rng.safetensors"), metadata={"format": "pt"})
        (folder / "config.yaml").write_text(config_to_yaml(config))
        state["files"] = {str(f.relative_to(folder)): f.stat().st_size for f in folder.rglob("*") if f.is_file()}
        _json_dump(state, folder / "state.json")  # last: its presence says the others are complete

    return write_atomically(path, write)


# ---- read and load ----------------------------------------------------------------------------------------
def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path`` names: itself, the latest ``step_*`` inside it, or the backup left by
    a crash in the middle of an overwrite."""
    path = Path(path)
    if (path / "state.json").is_file():
        return path
    if path.is_dir():
        if (latest := latest_checkpoint(path)) is not None:
            return latest
        raise CheckpointError(f"{path} holds no checkpoint (no state.json, no step_* folders)")
    backups = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
    backups = [b for b in backups if (b / "state.json").is_file()]
    if backups:
        warnings.warn(f"{path} is missing but a previous version survives at {backups[-1]} (a crash during an "
                      "overwrite); loading that", stacklevel=3)
        return backups[-1]
    raise CheckpointError(f"no checkpoint at {path}")


def read_checkpoint_state(path: str | Path) -> dict[str, Any]:
    """``state.json`` of a checkpoint, after checking it is one and that every file is whole."""
    folder = resolve_checkpoint(path)
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError) as e:  # ValueError: bad JSON or not UTF-8
        raise CheckpointError(f"{folder}/state.json is unreadable ({e}); use an earlier checkpoint") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{folder}/state.json holds no JSON object; use an earlier checkpoint")
    if state.get("format") != FORMAT or state.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{folder} is not an rlkit checkpoint of format version <= {FORMAT_VERSION}")
    if state["format_version"] < FORMAT_VERSION:
        raise CheckpointError(f"{folder} was written by an older rlkit (checkpoint format {state['format_version']}, "
                              f"this one reads {FORMAT_VERSION}: the policy state is now a distributed checkpoint); "
                              "resume it with the rlkit that wrote it, or export its weights there and start from them")
    if not isinstance(state.get("files"), dict):
        raise CheckpointError(f"{folder}/state.json lists no files; use an earlier checkpoint")
    for name, size in state["files"].items():
        if name != "state.json" and (not (folder / name).is_file() or (folder / name).stat().st_size != size):
            raise CheckpointError(f"{folder}/{name} is missing or truncated; use an earlier checkpoint")
    state["folder"] = str(folder)
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """The RNG states of the checkpoint whose ``state.json`` is ``state`` (:func:`read_checkpoint_state`): restored
    last, after the policy and the run state, so that nothing after them draws."""
    rng.restore(load_file(str(Path(state["folder"]) / "rng.safetensors")), state["rng"])


def checkpoint_config(folder: str | Path, config: Any = None, overrides: Sequence[str] | Mapping = ()) -> RunConfig:
    """The run config a session resuming the checkpoint in ``folder`` is built from: the checkpoint's own (or
    ``config``, e.g. to extend a run), with ``overrides``."""
    if config is None:
        return load_config(str(Path(folder) / "config.yaml"), overrides)
    if overrides:
        return load_config(config.model_dump(mode="json") if isinstance(config, RunConfig) else config, overrides)
    return config


# ---- periodic checkpoints ------------------------------------------------------------------------------------
def checkpoint_folder(config: Any, run_dir: Optional[str | Path] = None) -> Path:
    """Where a run's periodic checkpoints go: ``checkpointing.checkpoint_dir``, else ``<run_dir>/checkpoints``
    (the run folder defaults to ``<logger.log_dir>/<name>``)."""
    if config.checkpointing.checkpoint_dir:
        return Path(config.checkpointing.checkpoint_dir)
    return Path(run_dir or Path(config.logger.log_dir) / config.name) / "checkpoints"


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Complete ``step_*`` checkpoints in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_DIR.match(p.name))
             and (p / "state.json").is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(folder: str | Path) -> Optional[Path]:
    found = list_checkpoints(folder)
    return found[-1] if found else None


def resumable_checkpoint(folder: str | Path) -> Optional[Path]:
    """The newest checkpoint in ``folder`` that reads whole (:func:`read_checkpoint_state`); None if there is none.

    Why fall back: a checkpoint damaged after it was written (a disk error, a copy cut short) must not block a
    resume when the one before it is good. Each newer one that is skipped is named, with its problem, in a
    warning; when every checkpoint is damaged, CheckpointError lists them all (nothing is started afresh).
    """
    problems = []
    for candidate in reversed(list_checkpoints(folder)):
        try:
            read_checkpoint_state(candidate)
        except CheckpointError as e:
            problems.append(f"{candidate.name}: {e}")
            continue
        if problems:
            warnings.warn(f"resuming from {candidate}, the newest checkpoint that reads whole; skipped newer "
                          f"one(s): {'; '.join(problems)}", stacklevel=2)
        return candidate
    if problems:
        raise CheckpointError(f"no checkpoint in {folder} reads whole, so the run cannot resume: "
                              f"{'; '.join(problems)}. Fix: restore one from a copy, or start the run afresh "
                              "under another name")
    return None


def chosen_checkpoint(folder: str | Path, choice: str | int | Path) -> Path:
    """The checkpoint ``choice`` names: a step number of the ``step_*`` checkpoints in ``folder``, or a path to
    a checkpoint folder (a digit-only string is a step; write ``./5`` for a folder named 5). It must read
    whole: an explicit choice never falls back to another checkpoint."""
    folder = Path(folder)
    is_step = isinstance(choice, int) or str(choice).isdigit()
    path = folder / f"step_{int(choice):06d}" if is_step else Path(choice)
    if not (path / "state.json").is_file():
        found = ", ".join(f"{p.name} (step {int(p.name[5:])})" for p in list_checkpoints(folder)) or "none"
        raise CheckpointError(f"resume from {str(choice)!r}: there is no checkpoint at {path}. This run's "
                              f"checkpoints in {folder}: {found}. Fix: pick one of those (a step number or "
                              "a checkpoint folder)")
    return Path(read_checkpoint_state(path)["folder"])


def set_aside_newer(folder: str | Path, step: int) -> list[Path]:
    """Rename the ``step_*`` checkpoints in ``folder`` newer than ``step`` to ``step_<N>.superseded-<time>``.

    Why: a run resumed from an earlier checkpoint starts a new line of steps; the old line's checkpoints would
    otherwise be taken for its own by the next ``--resume`` and by pruning. They are kept, not deleted, under
    a name that neither reads as a checkpoint of the run nor gets pruned. Returns the new paths."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved = []
    for path in Path(folder).iterdir() if Path(folder).is_dir() else ():
        m = STEP_DIR.match(path.name)
        if m and int(m.group(1)) > step:
            target = path.with_name(f"{path.name}.superseded-{stamp}")
            os.rename(path, target)
            moved.append(target)
    return sorted(moved)


def prune_checkpoints(folder: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (each renamed away first, then removed)."""
    removed = []
    for old in list_checkpoints(folder)[:-keep_last] if keep_last > 0 else []:
        trash = old.parent / f".trash-{old.name}-{uuid.uuid4().hex[:8]}"
        os.rename(old, trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(old)
    return removed


def save_periodic(save: Callable[[Path], Path], folder: str | Path, step: int, keep_last: int) -> Path:
    """``save(folder/step_<step>)`` (a session's ``save``), then prune ``folder`` to ``keep_last`` checkpoints."""
    clean_stale_temporaries(folder)
    path = save(Path(folder) / f"step_{step:06d}")
    prune_checkpoints(folder, keep_last)
    return path


# ---- export -------------------------------------------------------------------------------------------------
def export_hf(policy: Any, cfg: Any, path: str | Path) -> Path:
    """The ``policy``'s current weights as an HF model folder (transformers and vLLM load it), atomically, with the
    config and tokenizer files of the model folder ``cfg.model_name`` (``cfg``: the run's ``policy`` section); with
    adapters, merged, and the PEFT adapter folder in ``adapter/`` (:func:`rlkit.tracking.export.export_hf_folder`)."""
    if policy is None:
        raise CheckpointError("this session is closed: nothing to export")
    return write_atomically(path, lambda tmp: export_hf_folder(policy, cfg.model_name, tmp, cfg.lora_cfg))


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint folder holds, read without building a session."""

    folder: Path
    step_count: int
    policy_version: int
    size_bytes: int

    @classmethod
    def read(cls, path: str | Path) -> "CheckpointInfo":
        state = read_checkpoint_state(path)
        folder = Path(state["folder"])
        return cls(folder, state["run_state"]["step"], read_policy_meta(folder / POLICY_DIR)["policy_version"],
                   sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()))
