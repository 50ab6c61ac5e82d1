"""The quiet engine start drops exactly the known notices, only inside its block, and nothing when verbose."""

import logging
import os
import warnings

from rlkit.quiet import KNOWN_LOG_RECORDS, quiet_engine_start, quieted

NUMA = b"[rank0]:[W1130 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation (function x)\n"


def warn_from(module: str, message: str, category=UserWarning) -> None:
    """``warnings.warn`` as if raised by code in ``module`` (what Megatron's and vLLM's imports do)."""
    warnings.warn_explicit(message, category, f"/venv/lib/python3.11/site-packages/{module.replace('.', '/')}.py", 21,
                           module=module, registry={})


def test_known_warnings_are_dropped_and_the_others_shown_after_the_block():
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet_engine_start() as held:
            warn_from("megatron.core.models.backends", "Apex is not installed. Falling back to Torch Norm")
            warn_from("vllm.triton_utils.dispatcher", "`torch.distributed.reduce_op` is deprecated, please use ...",
                      FutureWarning)
            warn_from("rlkit.config.checks", "policy.model_name='m' already holds a different model")
            warn_from("mylib.thing", "Apex is not installed")  # the same words from elsewhere: not known
            assert shown == []  # held until the block ends
    assert [str(w.message) for w in shown] == ["policy.model_name='m' already holds a different model",
                                               "Apex is not installed"]
    assert held.dropped == 2 and [str(w.message) for w in held.shown] == [str(w.message) for w in shown]


def test_known_vllm_log_records_are_dropped_only_inside_the_block(caplog):
    logger = logging.getLogger("vllm.engine.arg_utils")
    with caplog.at_level(logging.WARNING, logger="vllm"):
        with quiet_engine_start() as held:
            logger.warning("The global random seed is set to 0. Since ...")
            logger.warning("max_model_len is larger than the model's")  # not on the list
        logger.warning("The global random seed is set to 1. Since ...")  # after the block: shown
    assert [r.getMessage()[:36] for r in caplog.records] == ["max_model_len is larger than the mod",
                                                             "The global random seed is set to 1. "]
    assert held.dropped == 1
    assert all(not logging.getLogger(name).filters for name in KNOWN_LOG_RECORDS)


def test_known_lines_written_to_the_file_descriptors_are_dropped_and_the_others_written_back(capfd):
    with quiet_engine_start() as held:
        os.write(2, NUMA)
        os.write(2, b"a C++ line nobody listed\n")
        os.write(1, b"plain output\n")
    out, err = capfd.readouterr()
    assert (out, err) == ("plain output\n", "a C++ line nobody listed\n")
    assert held.dropped == 1
    os.write(2, NUMA)  # after the block the descriptors are the process's own again
    assert capfd.readouterr().err == NUMA.decode()


def test_verbose_holds_back_nothing(capfd):
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet_engine_start(verbose=True) as held:
            assert not quieted()
            warn_from("megatron.core.optimizer", "Transformer Engine and Apex are not installed.")
            os.write(2, NUMA)
    assert len(shown) == 1 and capfd.readouterr().err == NUMA.decode() and held.dropped == 0
    with quiet_engine_start():
        assert quieted()
    assert not quieted() and warnings.filters == filters


def test_a_quiet_data_load_shows_no_datasets_progress_bar_and_keeps_the_users_setting(tmp_path, capfd):
    """The data part of a session's start (rlkit.startup: every part is quiet) loading a JSON file for the first
    time: datasets' "Generating train split" bar is off inside, on again after, and stays off if the user had it off."""
    import datasets

    from rlkit.startup import StartupReport

    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"prompt": "{i}+1", "answer": "{i + 1}"}}\n' for i in range(50)))

    def load(name: str):
        return datasets.load_dataset("json", data_files=str(tmp_path / "prompts.jsonl"), split="train",
                                     cache_dir=str(tmp_path / name))

    assert datasets.is_progress_bar_enabled()
    with StartupReport().part("data"):
        assert len(load("quiet")) == 50
    assert "Generating train split" not in capfd.readouterr().err
    assert datasets.is_progress_bar_enabled()
    load("loud")  # outside the quiet start the bar shows (the test can fail)
    assert "Generating train split" in capfd.readouterr().err
    datasets.disable_progress_bars()
    try:
        with quiet_engine_start():
            pass
        assert not datasets.is_progress_bar_enabled()  # the user's choice kept
    finally:
        datasets.enable_progress_bars()
