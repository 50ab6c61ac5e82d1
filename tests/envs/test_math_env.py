r"""MathEnvironment with real math-verify in real worker processes.

The timeout tests use a genuinely pathological answer, ``\boxed{9^{9^{9^{9}}}}``: math-verify's comparison
with "1" tries to evaluate the tower and does not finish (it ran past 60 s when measured), so only the
worker kill can end the check.
"""

import threading
import time

import pytest

from rlkit.envs import MathEnvironment, last_boxed

TOWER = r"\boxed{9^{9^{9^{9}}}}"


def _conv(completion):
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": completion}]


@pytest.fixture(scope="module")
def env():
    e = MathEnvironment(timeout_seconds=0.5, num_workers=2)
    yield e
    e.close()


def test_last_boxed_extraction():
    assert last_boxed(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{2}") == "2"
    assert last_boxed(r"\boxed {3}") == "3"
    assert last_boxed(r"\boxed{1} and \boxed{unclosed") == "1"
    assert last_boxed(r"\boxed 5") is None
    assert last_boxed("the answer is 5") is None


@pytest.mark.timeout(60)
def test_equivalent_answers_score_one():
    # a generous timeout: this test is about equivalence, not time (a loaded machine made 0.5 s flaky)
    env = MathEnvironment(timeout_seconds=10, num_workers=2)
    cases = [
        (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{0.5}", r"\frac12", 1.0),
        (r"\boxed{x+1}", "1+x", 1.0),
        (r"\boxed{\sqrt{2}}", r"$\sqrt 2$", 1.0),
        (r"\boxed{3}", "4", 0.0),
        ("The answer is 4", "4", 0.0),  # no \boxed{}: 0, and not an error
        (r"\boxed{}", "4", 0.0),
    ]
    with env:
        out = env.step([_conv(c) for c, _, _ in cases], [{"answer": a} for _, a, _ in cases])
    assert out.rewards.tolist() == [r for _, _, r in cases]
    assert out.errors == []
    assert out.metadata[0] == {"extracted": r"\frac{1}{2}", "correct": True, "timed_out": False}
    assert out.metadata[5] == {"extracted": None, "correct": False, "timed_out": False}


@pytest.mark.timeout(60)
def test_pathological_answer_times_out_without_hanging_the_batch(env):
    restarts = env.pool.restarts
    start = time.monotonic()
    out = env.step([_conv(TOWER), _conv(r"\boxed{7}"), _conv(r"\boxed{2}")], [{"answer": "1"}, {"answer": "7"},
                                                                             {"answer": "3"}])
    elapsed = time.monotonic() - start
    assert out.rewards.tolist() == [0.0, 1.0, 0.0]
    assert out.errors == ["sample 0: TimeoutError: math-verify took longer than 0.5 s"]
    assert out.metadata[0]["timed_out"] and not out.metadata[1]["timed_out"]
    assert 0.5 <= elapsed < 5.0
    assert env.pool.restarts == restarts + 1
    # The replaced worker serves the next step normally.
    assert env.step([_conv(r"\boxed{6}")], [{"answer": "6"}]).rewards.tolist() == [1.0]


@pytest.mark.timeout(60)
def test_timeout_works_when_step_runs_in_a_thread(env):
    # math-verify's own signal-based timeout would fail here ("signal only works in main thread").
    results = []
    thread = threading.Thread(target=lambda: results.append(
        env.step([_conv(TOWER), _conv(r"\boxed{2}")], [{"answer": "1"}, {"answer": "2"}])))
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "step hung in a non-main thread"
    assert results[0].rewards.tolist() == [0.0, 1.0]
    assert results[0].metadata[0]["timed_out"] is True


@pytest.mark.timeout(60)
def test_unparsable_reference_and_missing_answer_are_counted_errors(env):
    out = env.step([_conv(r"\boxed{1}"), _conv(r"\boxed{1}")], [{"answer": ""}, {"question": "?"}])
    assert out.rewards.tolist() == [0.0, 0.0]
    assert out.errors[0].startswith("sample 0: ValueError: math-verify cannot parse the reference answer")
    assert out.errors[1] == "sample 1: KeyError: 'answer'"


def test_bad_arguments():
    with pytest.raises(ValueError, match="timeout_seconds > 0"):
        MathEnvironment(timeout_seconds=0)
    with pytest.raises(ValueError, match="num_workers >= 1"):
        MathEnvironment(num_workers=0)
    assert repr(MathEnvironment(timeout_seconds=2)) == "MathEnvironment(timeout_seconds=2, num_workers=2)"
