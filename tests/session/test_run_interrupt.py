"""Jupyter's stop button (a SIGINT in the kernel) during ``Session.run()``: one line that says after which step
it stopped, the finished steps in ``session.history``, and a session the next cell can keep stepping.

The kernel test interrupts a real kernel the way JupyterLab's stop button does (``interrupt_kernel``) once two
steps have finished, and reads the error the kernel reports: before this, a 43-frame traceback through vLLM
and oneDNN."""

import time

import pytest

import rlkit
from rlkit.errors import RunInterrupted
from tests.session.conftest import tiny_overrides


def test_an_interrupted_run_names_its_last_step_and_keeps_the_finished_ones(tmp_path):
    session = rlkit.Session.from_config("quickstart", tiny_overrides(tmp_path))
    try:
        def stop_after_two(metrics):
            if metrics.step == 2:
                raise KeyboardInterrupt

        with pytest.raises(RunInterrupted, match=r"run\(\) stopped after step 2 \(2 of 5 finished") as caught:
            session.run(5, progress=False, on_step=stop_after_two)
        assert isinstance(caught.value, KeyboardInterrupt) and caught.value.__suppress_context__
        assert [m.step for m in session.history] == [1, 2]
        assert session.step().step == 3 and not session.stale  # the next cell carries on
    finally:
        session.close()


def test_the_stop_button_in_a_real_kernel_shows_one_line(tmp_path, monkeypatch):
    from jupyter_client import KernelManager

    from tests.tutorials.notebooks import KERNEL_NAME, jupyter_path_env, write_kernelspec

    write_kernelspec(tmp_path / "jupyter")
    for key, value in jupyter_path_env(tmp_path / "jupyter").items():
        monkeypatch.setenv(key, value)
    km = KernelManager(kernel_name=KERNEL_NAME)
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        steps = tmp_path / "steps"
        setup = (f"import rlkit\ns = rlkit.Session.from_config('quickstart', {tiny_overrides(tmp_path)!r})\n"
                 f"s.listeners.append(lambda m: open({str(steps)!r}, 'a').write('.'))")
        assert kc.execute_interactive(setup, timeout=300)["content"]["status"] == "ok"
        msg_id = kc.execute("hist = s.run(500, progress=False)")
        deadline = time.monotonic() + 300
        while not (steps.is_file() and len(steps.read_text()) >= 2):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        km.interrupt_kernel()
        errors = []
        while True:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                errors.append(msg["content"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert len(errors) == 1 and errors[0]["ename"] == "RunInterrupted"
        assert len(errors[0]["traceback"]) == 1 and "the session is consistent" in errors[0]["traceback"][0]
        check = kc.execute_interactive("n = len(s.history); assert s.step().step == n + 1", timeout=300)
        assert check["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
