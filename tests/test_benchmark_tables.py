"""The benchmark tables in README.md and benchmarks/README.md are generated from the results JSON.

``benchmarks/make_tables.py`` writes every generated block; these tests run it on the committed
JSON files and require the committed Markdown to be exactly its output, so a figure cannot be
edited by hand or left behind when a results file changes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "make_tables.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("make_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_tables"] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


make_tables = _load_script()


def _table(name: str):
    return next(t for t in make_tables.TABLES if t.name == name)


@pytest.fixture
def results_copy(tmp_path: Path) -> Path:
    """A writable copy of benchmarks/results/ (JSON only)."""
    out = tmp_path / "results"
    out.mkdir()
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        shutil.copy(path, out / path.name)
    return out


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _row_of(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {label}"))


def test_committed_markdown_is_the_scripts_output():
    # what `python benchmarks/make_tables.py --check` checks, on the committed JSON files
    for file, text in make_tables.generate(ROOT).items():
        assert (ROOT / file).read_text() == text, (
            f"{file} differs from its results JSON: run python benchmarks/make_tables.py"
        )


def test_every_table_has_its_markers_once():
    for table in make_tables.TABLES:
        text = (ROOT / table.file).read_text()
        for end in ("begin", "end"):
            assert text.count(make_tables.MARK.format(end, table.name)) == 1, (table.file, end)


def test_check_flag_fails_on_a_hand_edited_figure(tmp_path: Path):
    # a copy of the repository's Markdown with one generated figure changed by hand
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    shutil.copytree(ROOT / "benchmarks" / "results", root / "benchmarks" / "results")
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copy(ROOT / "benchmarks" / "README.md", root / "benchmarks" / "README.md")
    run = [sys.executable, str(SCRIPT), "--check", "--root", str(root)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's agentgym, for the rewrite
    assert subprocess.run(run, capture_output=True, text=True, env=env).returncode == 0
    readme = root / "README.md"
    block = make_tables.read_block(readme.read_text(), "performance")
    edited = block.replace("| step ", "| step 1", 1)
    assert edited != block
    readme.write_text(readme.read_text().replace(block, edited))
    out = subprocess.run(run, capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert "out of date: README.md" in out.stdout
    # without --check the script rewrites the block from the JSON
    subprocess.run(run[:2] + run[3:], check=True, capture_output=True, env=env)
    assert subprocess.run(run, capture_output=True, text=True, env=env).returncode == 0


def test_performance_ratios_are_read_from_the_json(results_copy: Path):
    table = _table("performance")
    before = make_tables.render(table, results_copy)
    alfworld = "| ALFWorld, held-out valid_train games"

    def set_ratios(d):
        s = d["steps_resets"]
        s["step_total_time_ratio"] = 4321.0
        s["total_time_ratios_per_repeat"]["step"] = [4000.0, 4321.0, 4500.0]
        s["step_total_cpu_ratio"] = 777.0
        s["reset_cold_total_cpu_ratio"] = 55.5
        s["episode_total_cpu_ratio"] = 66.0
        s["total_cpu_ratios_per_repeat"] = {"step": [700.0, 777.0, 800.0]}

    _edit(results_copy / "alfworld_valid_train.json", set_ratios)
    after = make_tables.render(table, results_copy)
    row = _row_of(after, alfworld[2:])
    assert row != _row_of(before, alfworld[2:])
    assert "**777x** steps, 55.5x cold resets, 66x both" in row
    assert "(steps per repeat: 700x, 777x, 800x)" in row
    assert "4,321x steps" in row
    # the other rows did not move
    webshop = "WebShop step"
    assert _row_of(after, webshop) == _row_of(before, webshop)


def test_repeats_that_disagree_are_flagged(results_copy: Path):
    def spread(d):
        d["vs_stock"]["total_time_ratios_per_repeat"]["steps"] = [50.0, 100.0, 90.0]

    _edit(results_copy / "webshop_vs_stock.json", spread)
    row = _row_of(make_tables.render(_table("performance"), results_copy), "WebShop step")
    assert "50x, 100x, 90x; spread 2.0x, above 1.5x" in row


def test_a_row_whose_json_is_absent_is_left_out(results_copy: Path):
    table = _table("performance")
    assert "| Search-QA" in make_tables.render(table, results_copy)
    (results_copy / "searchr1.json").unlink()
    text = make_tables.render(table, results_copy)
    assert "| Search-QA" not in text
    assert "| ALFWorld" in text and "| WebShop" in text


def test_a_new_row_is_one_function_of_its_json(results_copy: Path):
    # how a later benchmark adds its row: a Row naming its JSON and a function to cells
    (results_copy / "extra.json").write_text(json.dumps({"ratio": 12.5}))
    table = make_tables.Table(
        name="t",
        file="README.md",
        header=["peer", "ratio"],
        rows=[
            make_tables.Row("extra.json", lambda d: ["peer", make_tables.x(d["ratio"])]),
            make_tables.Row("not_run_yet.json", lambda d: ["never", "shown"]),
        ],
    )
    assert (
        make_tables.render(table, results_copy)
        == "| peer | ratio |\n|---|---:|\n| peer | 12.5x |\n"
    )


def test_each_performance_command_writes_the_json_its_row_reads():
    table = _table("performance")
    for row in table.rows:
        path = ROOT / "benchmarks" / "results" / row.source
        if not path.is_file():
            continue
        cells = row.cells(json.loads(path.read_text()))
        assert f"--out benchmarks/results/{row.source}`" in cells[-1], (row.source, cells[-1])


def test_number_format():
    assert [make_tables.num(v) for v in (0.17567, 11.68, 98.0, 167.8, 1836.75)] == [
        "0.176",
        "11.7",
        "98",
        "168",
        "1,837",
    ]


def test_no_hand_written_table_is_left_in_the_benchmarks_readme():
    # every table row of benchmarks/README.md sits in a generated block (ours, or the credit
    # ground-truth report that bench_credit_ground_truth.py writes from its own JSON)
    text = (ROOT / "benchmarks" / "README.md").read_text()
    for table in make_tables.TABLES:
        if table.file == make_tables.BENCH_README:
            text = text.replace(make_tables.read_block(text, table.name), "")
    begin, end = "<!-- credit-ground-truth:begin -->", "<!-- credit-ground-truth:end -->"
    text = text.split(begin)[0] + text.split(end)[1]
    assert [line for line in text.splitlines() if line.startswith("|")] == []
