"""bench/run_all.py: the figures each benchmark prints last, one table, one JSON file per run.

Real subprocesses of stand-in benchmarks (two tiny scripts written here, standing in for the real ones, which
take minutes): what is tested is the collection, the table and the file, not the benchmarks.
"""

import json
import sys

import pytest

from tests.bench import BENCH, bench_script


@pytest.fixture
def run_all(monkeypatch):
    return bench_script("run_all")


def test_every_listed_benchmark_exists(run_all):
    assert all((BENCH / f"{name}.py").is_file() for name in run_all.SCRIPTS)
    assert "gpu_check" not in run_all.SCRIPTS


def test_figures_are_the_last_lines_name_value_pairs(run_all):
    assert run_all.figures_of("refit_over_floor=1.04 refit_ms=40.5 note=abc") == {"refit_over_floor": 1.04,
                                                                                  "refit_ms": 40.5}
    assert run_all.figures_of("ratio rlkit / vLLM: 0.99") == {}
    assert run_all.verdict("refit_over_floor", 1.1) == "<= 1.2: met"
    assert run_all.verdict("async_over_sync", 0.9) == ">= 1: MISSED"
    assert run_all.verdict("refit_ms", 40.0) == ""


def test_one_table_and_one_json_with_a_failed_benchmark_reported(run_all, tmp_path, monkeypatch, capsys):
    (tmp_path / "fast.py").write_text("print('some output')\nprint('refit_over_floor=1.5 rollout_over_vllm=0.97')\n")
    (tmp_path / "broken.py").write_text("raise SystemExit(3)\n")
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"results": {"fast": {"refit_over_floor": 7.3}}}))
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    monkeypatch.setattr(run_all, "SCRIPTS", ["fast", "broken"])
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--compare", str(earlier), "--out", str(out)])
    run_all.main()
    record = json.loads(out.read_text())
    assert record["results"] == {"fast": {"refit_over_floor": 1.5, "rollout_over_vllm": 0.97}, "broken": {}}
    assert record["failures"] == {"broken": "exit status 3"}
    assert record["machine"]["cpus"] > 0 and record["commit"]
    table = capsys.readouterr().out.split("== all figures")[1]
    assert "refit_over_floor" in table and "7.3" in table and "<= 1.2: MISSED" in table
    assert ">= 0.95: met" in table and "FAILED: exit status 3" in table
