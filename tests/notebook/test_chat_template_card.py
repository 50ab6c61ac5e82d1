"""The session card shows how prompts are rendered: data.chat_template_kwargs and the environment's JSON tools.

A stand-in run (attributes only, rlkit.run.run.Run's names) is enough: the card reads attributes, as tests/notebook/test_display.py
checks with its tripwire."""

from types import SimpleNamespace

from rlkit.config.loading import load_config
from rlkit.envs.tool_arithmetic import NativeToolArithmeticEnvironment
from rlkit.notebook.display import session_facts, session_html


def card_session(overrides, env):
    policy = SimpleNamespace(version=0, arch=None, layout=SimpleNamespace(sequence_parallel=False))
    return SimpleNamespace(config=load_config("quickstart", overrides), policy=policy, generator="G",
                           components=SimpleNamespace(env=env), loss_fn="RLLoss(ppo_clip)",
                           state=SimpleNamespace(step=0, history=[]), generator_version=0, stale=False, rollouts=None)


def test_the_card_shows_the_template_kwargs_and_tools():
    plain = card_session([], SimpleNamespace(name="arithmetic"))
    assert session_facts(plain)["chat template"] == "the template's defaults"
    native = card_session(["data.chat_template_kwargs={enable_thinking: false}"], NativeToolArithmeticEnvironment())
    assert session_facts(native)["chat template"] == "enable_thinking=False; tools: add"
    assert "enable_thinking=False; tools: add" in session_html(native)
