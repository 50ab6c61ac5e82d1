"""Every public method and property of Session and of the objects it hands back has a docstring, so that
``help(session.score)`` or Shift-Tab in Jupyter explains it. The list of classes is what the session's methods
and attributes return; members inherited from outside rlkit (pydantic's, dataclasses') are theirs to document.
"""

import inspect

import pytest

from rlkit.algorithms import LossParams, RLLoss
from rlkit.config.components import GenerationConfig, PolicyConfig
from rlkit.config.run import GRPOConfig, RunConfig
from rlkit.generation.base import SamplingSettings
from rlkit.notebook.dashboard import Dashboard
from rlkit.notebook.display import TokenView
from rlkit.run.metrics import StepMetrics
from rlkit.run.state import RunState
from rlkit.session import Session
from rlkit.startup import StartupReport
from rlkit.stages import EvalResult, LossReport, SFTResult, TrainResult
from rlkit.trajectories import Trajectories
from rlkit.weight_sync.colocated import RefitReport

RETURNED = [Session, Trajectories, StepMetrics, TrainResult, LossReport, EvalResult, SFTResult, RefitReport,
            TokenView, Dashboard, SamplingSettings, RunState, RLLoss, LossParams, RunConfig, PolicyConfig,
            GenerationConfig, GRPOConfig, StartupReport]


def public_members(cls):
    """``(name, member)`` of every public function, property, classmethod and staticmethod that rlkit defines
    on ``cls`` or on one of its rlkit base classes."""
    seen = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("rlkit"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, (property, classmethod, staticmethod)) or inspect.isfunction(member):
                seen[name] = member
    return seen


def doc_of(member):
    target = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
    return (getattr(target, "__doc__", None) or "").strip()


@pytest.mark.parametrize("cls", RETURNED, ids=lambda c: c.__name__)
def test_every_public_member_has_a_docstring(cls):
    missing = sorted(name for name, member in public_members(cls).items() if not doc_of(member))
    assert missing == [], f"{cls.__name__}: no docstring on {missing}"


@pytest.mark.parametrize("cls", RETURNED, ids=lambda c: c.__name__)
def test_the_class_itself_has_a_docstring(cls):
    doc = (cls.__doc__ or "").strip()
    assert doc and not doc.startswith(f"{cls.__name__}("), f"{cls.__name__}: no docstring (dataclass signature: {doc!r})"


def test_the_enumeration_sees_the_stage_methods():
    names = set(public_members(Session))
    assert {"rollout", "score", "logprobs", "advantages", "loss", "train", "refit", "step", "run", "request_stop",
            "sampling", "configure", "reset", "evaluate", "sft", "dashboard", "save", "load", "close",
            "history", "stale"} <= names
