"""The memory plan shows each figure in the unit that shows it (a nano model's parts are KiB, not "0.00 GiB"),
through one helper, :mod:`rlkit.units`."""

import pytest

from rlkit.memory.plan import GIB, Device, plan_memory
from rlkit.units import bytes_text, count_text
from tests.memory.test_memory_plan import CPU, HF, config


@pytest.fixture(scope="module")
def folder(model_factory):
    return str(model_factory("nano", "llama"))


def test_bytes_and_counts_take_the_unit_that_shows_them():
    assert [bytes_text(n) for n in (0, 512, 8864, 3 * 2**20, int(0.8 * GIB), 12.34 * GIB)] == \
        ["0 B", "512 B", "8.66 KiB", "3.00 MiB", "819 MiB", "12.3 GiB"]
    assert [count_text(n) for n in (640, 2216, 103_456, 1.5e6, 135e6, 7e9)] == \
        ["640", "2.22K", "103K", "1.50M", "135M", "7.00B"]


def test_a_nano_plan_shows_kib_and_thousands_of_parameters(folder):
    text = plan_memory(config(folder), HF, CPU).table()
    weights = next(line for line in text.splitlines() if line.strip().startswith("weights"))
    assert "8.66 KiB" in weights and "2.22K parameters x 4 B" in weights  # 2216 parameters, fp32
    assert "0.00 GiB" not in text and "0M parameters" not in text
    assert "runtime" in text and "819 MiB" in text and "of 100 GiB available" in text
    html = plan_memory(config(folder), HF, CPU)._repr_html_()
    assert html.startswith("<pre") and "8.66 KiB" in html and "0.00 GiB" not in html


def test_a_refusal_names_its_figures_in_their_units(folder):
    small = Device("cpu", 64 * 2**20, "a 64 MiB test CPU")
    message = str(pytest.raises(Exception, plan_memory(config(folder), HF, small).refuse_if_over, config(folder)).value)
    assert "has 64.0 MiB" in message and "runtime (819 MiB)" in message and "0.0 GiB" not in message
