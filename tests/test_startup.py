"""A session starts quietly: one progress line per engine, rlkit's own warning, and no third-party line.

Measured in a fresh Python process (Megatron's and vLLM's import-time notices appear once per process), with
its stdout and stderr captured whole, C++ output included. Then, in the same process, the filters are shown to
be gone (a warning of your own still shows) and ``verbose=True`` brings vLLM's notices back.
"""

import subprocess
import sys

import pytest

SCRIPT = r'''
import sys, warnings
import rlkit
from rlkit.models import make_model

def mark(name):
    for stream in (sys.stdout, sys.stderr):
        print(f"== {name}", file=stream, flush=True)

make_model("models/other", "nano", "llama")  # a folder that already holds another model than the preset's
mark("start")
s = rlkit.Session.from_config("quickstart_nano", {"policy.model_name": "models/other", "policy.model_preset": "tiny",
                                                  "sft.enabled": False, "grpo.num_prompts_per_step": 4})
mark("started")
print("STARTUP", s.startup, flush=True)
print("CARD", s._repr_html_(), flush=True)
warnings.warn("Apex is not installed (a warning of my own, after the start)")
s.close()
mark("verbose")
v = rlkit.Session.from_config("quickstart_nano", {"policy.model_name": "models/other", "policy.model_preset": None,
                                                  "sft.enabled": False}, verbose=True)
mark("end")
'''


def phases(text: str) -> dict[str, list[str]]:
    """Lines of one stream between the ``== name`` marks."""
    out, name = {}, "before"
    for line in text.splitlines():
        if line.startswith("== "):
            name = line[3:]
            continue
        out.setdefault(name, []).append(line)
    return out


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    folder = tmp_path_factory.mktemp("start")
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return phases(done.stdout), phases(done.stderr)


def test_session_start_prints_one_line_per_engine_and_only_rlkits_warning(streams):
    out, err = streams
    started = out["start"]
    assert len(started) == 2, started
    assert started[0].startswith("rlkit: starting the policy (Megatron-Core) ... ready in ")
    assert started[1].startswith("rlkit: starting the generator (vLLM, in this process) ... ready in ")
    # stderr: rlkit's own warning (two lines: the message and its source line), and nothing else
    assert len(err["start"]) == 2, err["start"]
    assert "UserWarning: policy.model_name='models/other' already holds a different model" in err["start"][0]


def test_the_session_card_shows_rlkits_warning_and_the_start_up_breakdown(streams):
    out, _ = streams
    startup = next(line for line in out["started"] if line.startswith("STARTUP"))
    for part in ("model folder", "tokenizer", "data", "policy", "generator"):
        assert f"{part} " in startup
    held = int(startup.split("; ")[1].split()[0])
    assert held >= 20  # Megatron's Apex/TE warnings, vLLM's notes, the NUMA line (about 24 on CPU)
    card = next(line for line in out["started"] if line.startswith("CARD"))
    assert "1 warning(s) at start" in card and "already holds a different model" in card
    assert "known third-party notices held back" in card


def test_the_filters_end_with_the_start_and_verbose_brings_the_notices_back(streams):
    out, err = streams
    assert "UserWarning: Apex is not installed (a warning of my own, after the start)" in "\n".join(err["started"])
    vllm_lines = [line for line in out["verbose"] + err["verbose"] if "WARNING" in line and "vllm" in line.lower()
                  or "[cpu_worker.py" in line or "[arg_utils.py" in line]
    assert len(vllm_lines) >= 5, out["verbose"] + err["verbose"]  # seed, eager mode, Triton, LD_PRELOAD, threads...
