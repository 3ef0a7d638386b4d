"""``agentgym eval`` says when nothing useful ran: no episode, every turn failed, or a server that
refuses the run's requests; pass@k counts complete groups only; identical group members at a
temperature above 0 are flagged; progress shows turns as they come back."""

from __future__ import annotations

import asyncio
import json

from agentgym.cli import main
from agentgym.engine import EpisodeRecord, OpenAIChatPolicy, SamplingParams, summarize
from agentgym.engine.runner import Turn


def _eval(tmp_path, *argv: str) -> tuple[int, dict]:
    code = main(["eval", *argv, "--out-dir", str(tmp_path)])
    results = tmp_path / "results.json"
    return code, json.loads(results.read_text()) if results.is_file() else {}


def test_no_env_that_can_run_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "no-data-here"))
    code, results = _eval(tmp_path, "ALFWorld-v0", "--base-url", "http://127.0.0.1:9", "--quiet")
    assert code == 2
    assert results["ok"] is False and results["complete"] is False
    assert results["episodes_planned"] == 0 and "nothing to evaluate" in results["error"]
    assert "nothing to evaluate" in capsys.readouterr().err


def test_a_dead_server_is_an_error_not_a_result(faulty_server, tmp_path, capsys):
    _, down = faulty_server
    code, results = _eval(
        tmp_path, "Corridor-v0", "--base-url", down, "--served-model", "m", "--tasks", "2",
        "--retries", "0", "--quiet",
    )  # fmt: skip
    assert code == 1
    assert results["ok"] is False and "every one of the 4 turns failed" in results["error"]
    assert "{'connection': 4}" in results["error"]
    assert "cannot reach" in capsys.readouterr().err


def test_a_refused_first_request_stops_the_run_with_one_clear_line(faulty_server, tmp_path, capsys):
    base, _ = faulty_server
    code, results = _eval(
        tmp_path, "Corridor-v0", "--base-url", f"{base}/model404", "--served-model", "nope",
        "--tasks", "3", "--quiet",
    )  # fmt: skip
    assert code == 2
    assert results["ok"] is False and results["episodes_finished"] == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(lines) == 1
    assert (
        "HTTP 404" in lines[0] and "it serves faulty, not 'nope': check --served-model" in lines[0]
    )


def test_after_a_first_answer_a_4xx_is_one_failed_turn(faulty_server):
    base, _ = faulty_server
    policy = OpenAIChatPolicy(f"{base}/flip-later", model="faulty", retries=0)
    msgs = [{"role": "user", "content": "hi"}]

    async def go():
        try:
            return [await policy.act(msgs, SamplingParams()) for _ in range(3)]
        finally:
            await policy.aclose()

    first, second, third = asyncio.run(go())
    assert first.error is None and third.error is None
    assert second.error_kind == "http_status" and "HTTP 400" in second.error


def _record(group: int, member: int, won: bool, text: str = "x") -> EpisodeRecord:
    turn = Turn(0, [], text, "a", True, float(won), won, False, None, None, 0, 0.1, 0.0, won=won)
    return EpisodeRecord("E", group, member, group, 0, turns=[turn], won=won)


def test_pass_at_k_counts_only_complete_groups():
    # group 0 finished both members (one won); group 1 was cut off after one losing member
    episodes = [_record(0, 0, True), _record(0, 1, False), _record(1, 0, False)]
    summary = summarize(episodes, group_size=2)
    assert summary["k"] == 2 and summary["pass@k"] == 1.0
    assert summary["groups_complete"] == 1 and summary["groups_incomplete"] == 1
    assert summary["pass@1"] == 0.25  # (1/2 + 0/1) / 2: each group's own rate
    assert any("1 complete groups only" in w for w in summary["warnings"])
    full = summarize([*episodes, _record(1, 1, True)], group_size=2)
    assert full["pass@k"] == 1.0 and full["groups_incomplete"] == 0 and not full["warnings"]


def test_identical_group_members_at_a_temperature_are_flagged():
    same = [_record(g, m, False, "go left") for g in range(2) for m in range(3)]
    warned = summarize(same, group_size=3, temperature=1.0)
    assert warned["identical_groups"] == warned["groups_compared"] == 2
    assert any("not sampling" in w for w in warned["warnings"])
    assert not summarize(same, group_size=3, temperature=0.0)["warnings"]  # greedy: expected
    varied = [*same[:5], _record(1, 2, False, "go right")]
    assert summarize(varied, group_size=3, temperature=1.0)["warnings"] == []


def test_cli_flags_a_server_that_ignores_the_temperature(faulty_server, tmp_path, capsys):
    base, _ = faulty_server  # /ok answers the same text whatever the temperature
    code, results = _eval(
        tmp_path, "Corridor-v0", "--base-url", f"{base}/ok", "--tasks", "2", "--group-size", "2",
        "--max-turns", "2", "--temperature", "1", "--quiet",
    )  # fmt: skip
    assert code == 0 and results["ok"] is True
    env = results["envs"]["AgentGym/Corridor-v0"]
    assert env["identical_groups"] == 2 and "not sampling" in env["warnings"][0]
    captured = capsys.readouterr()
    assert "warning: every group's episodes are identical" in captured.out
    assert "not sampling" in captured.err


def test_no_turn_played_is_a_problem():
    from agentgym.engine.cli import _problem

    broken = EpisodeRecord("E", 0, 0, 0, 0, end_reason="env_error", error="KeyError: 'split'")
    code, why = _problem(["E"], [broken])
    assert code == 1 and "no episode played a turn" in why and "KeyError" in why
    assert _problem(["E"], []) == (1, "no episode finished")
    assert _problem(["E"], [_record(0, 0, False)]) is None


def test_progress_shows_turns_and_tokens_as_they_come(faulty_server, tmp_path, capsys):
    base, _ = faulty_server
    code, _ = _eval(
        tmp_path, "Corridor-v0", "--base-url", f"{base}/ok", "--tasks", "1", "--max-turns", "3",
    )  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert "turns=" in err and "tokens=" in err
