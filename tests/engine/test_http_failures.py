"""A server that is down, slow, answers 500 or garbage never kills a run: the turns become
invalid steps, the episodes end truncated with the reason, and the summary counts them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.cli import main
from agentgym.engine import (
    OpenAIChatPolicy,
    RolloutEngine,
    SamplingParams,
    make_episodes,
    summarize,
)


def _run(policy, specs, **kw):
    engine = RolloutEngine(policy, SamplingParams(temperature=0, max_tokens=8), **kw)

    async def go():
        try:
            return await engine.run(specs)
        finally:
            await policy.aclose()

    return asyncio.run(go()), engine


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("500", "http_status"),
        ("garbage", "bad_response"),
        ("slow", "timeout"),
        ("down", "connection"),
    ],
)
def test_failing_server_ends_turns_invalid_and_episodes_truncated(faulty_server, mode, kind):
    base, down = faulty_server
    url = down if mode == "down" else f"{base}/{mode}"
    policy = OpenAIChatPolicy(url, timeout=0.5, retries=1, backoff=0.01, model="faulty")
    specs = make_episodes("AgentGym/Corridor-v0", tasks=2, group_size=2)
    records, engine = _run(policy, specs, max_turns=5, max_policy_errors=2)

    assert len(records) == 4
    for rec in records:
        # two failed turns in a row end the episode, each an invalid step with the reason kept
        assert rec.end_reason == "policy_errors" and rec.truncated and not rec.terminated
        assert [t.action_valid for t in rec.turns] == [False, False]
        assert all(t.error_kind == kind and t.error for t in rec.turns)
        assert all(t.action is None for t in rec.turns)
        assert rec.error is not None
    summary = summarize(records)
    assert summary["policy_errors"] == {kind: 8}
    assert summary["end_reasons"] == {"policy_errors": 4}
    # no answer is not an invalid action: failed turns are counted apart, timeouts apart again
    assert summary["answered_turns"] == 0 and summary["invalid_action_rate"] == 0.0
    assert summary["failed_turn_rate"] == 1.0
    assert summary["timeout_rate"] == (1.0 if kind == "timeout" else 0.0)
    assert engine.stats.errors == {kind: 8}


def test_retry_recovers_from_a_busy_answer(faulty_server):
    base, _ = faulty_server
    policy = OpenAIChatPolicy(f"{base}/flaky", timeout=5, retries=2, backoff=0.01, model="faulty")
    out = asyncio.run(policy.act([{"role": "user", "content": "hi"}], SamplingParams()))
    asyncio.run(policy.aclose())
    assert out.error is None and out.attempts == 2
    # vLLM's "token_id:<id>" tokens give the sampled ids; their log-probs are kept
    assert out.token_ids == [60, 61] and out.logprobs == [-0.25, -1.5]
    assert out.text == "<think>go</think><action>red</action>"


def test_a_strict_server_gets_the_request_without_vllm_fields(faulty_server):
    base, _ = faulty_server
    policy = OpenAIChatPolicy(f"{base}/strict", retries=0, model="faulty")

    async def two_at_once():  # both sent with the field before either learns it is refused
        msgs = [{"role": "user", "content": "hi"}]
        return await asyncio.gather(*(policy.act(msgs, SamplingParams()) for _ in "ab"))

    outs = asyncio.run(two_at_once())
    assert [o.error for o in outs] == [None, None]
    assert policy._token_ids_field is False  # dropped once, not retried on every turn


def test_cli_against_a_500_server_counts_and_exits_non_zero(faulty_server, tmp_path, capsys):
    base, _ = faulty_server
    argv = f"eval Corridor-v0 --base-url {base}/500 --served-model faulty --tasks 1"
    argv += " --group-size 2 --max-episode-steps 3 --timeout 2 --retries 0 --quiet --api-key sk-secret-1"
    code = main([*argv.split(), "--out-dir", str(tmp_path)])
    assert code == 1  # every turn failed: nothing was evaluated
    assert "sk-secret-1" not in (tmp_path / "results.json").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    env = results["envs"]["AgentGym/Corridor-v0"]
    assert results["complete"] and results["episodes_finished"] == 2
    assert results["ok"] is False and "every one of the 4 turns failed" in results["error"]
    assert env["policy_errors"] == {"http_status": 4} and env["end_reasons"] == {"policy_errors": 2}
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 2
    turn = json.loads(lines[0])["turns"][0]
    assert "HTTP 500" in turn["error"] and turn["action_valid"] is False
    captured = capsys.readouterr()
    assert "policy errors         http_status 4" in captured.out
    assert "every one of the 4 turns failed" in captured.err


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys):
    assert (
        main(
            ["eval", "NoSuchEnv-v9", "--base-url", "http://127.0.0.1:9", "--out-dir", str(tmp_path)]
        )
        == 2
    )
    assert "NoSuchEnv-v9" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "Corridor-v0", "--base-url", "http://x", "--top-p", "0"])
    with pytest.raises(SystemExit):  # one model source, not two
        main(["eval", "Corridor-v0", "--base-url", "http://x", "--model", "m"])


def test_ctrl_c_writes_what_has_finished(faulty_server, tmp_path):
    base, _ = faulty_server
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.cli",
            "eval",
            "Corridor-v0",
            "--base-url",
            f"{base}/ok",
            "--tasks",
            "200",
            "--concurrency",
            "1",
            "--max-episode-steps",
            "3",
            "--out-dir",
            str(tmp_path),
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    jsonl = tmp_path / "trajectories.jsonl"
    deadline = time.monotonic() + 120
    while not (jsonl.is_file() and jsonl.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stderr.read() if proc.poll() else "slow"
        )
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    results = json.loads((tmp_path / "results.json").read_text())
    lines = jsonl.read_text().splitlines()
    assert results["complete"] is False
    assert 2 <= results["episodes_finished"] == len(lines) < 200
    assert results["envs"]["AgentGym/Corridor-v0"]["episodes"] == len(lines)
    assert "interrupted" in err


def test_cli_skips_an_env_it_cannot_build_and_runs_the_others(
    faulty_server, tmp_path, monkeypatch, capsys
):
    base, _ = faulty_server
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "no-data-here"))
    code = main(
        [
            "eval",
            "ALFWorld-v0",
            "Corridor-v0",
            "--base-url",
            f"{base}/ok",
            "--tasks",
            "1",
            "--max-episode-steps",
            "2",
            "--out-dir",
            str(tmp_path / "out"),
            "--quiet",
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(results["skipped"]) == ["AgentGym/ALFWorld-v0"]
    assert list(results["envs"]) == ["AgentGym/Corridor-v0"]
    assert results["envs"]["AgentGym/Corridor-v0"]["policy_errors"] == {}
    (row,) = [
        json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    ]
    # the ok server answers "<think>go</think><action>red</action>": parsed, handed to the env
    assert [t["action"] for t in row["turns"]] == ["red"] * len(row["turns"])
    assert all(t["parse_error"] is None for t in row["turns"])
    assert "skipping AgentGym/ALFWorld-v0" in capsys.readouterr().err


# -- reading what real servers send ----------------------------------------------------------


def _act(url: str, **kw):
    policy = OpenAIChatPolicy(url, model="faulty", **kw)

    async def go():
        try:
            return await policy.act([{"role": "user", "content": "hi"}], SamplingParams())
        finally:
            await policy.aclose()

    return asyncio.run(go())


def test_llama_cpp_token_ids_and_logprobs_are_kept(faulty_server, faulty_log):
    base, _ = faulty_server
    out = _act(f"{base}/llama-ids", retries=0)
    # llama.cpp returns log-probs only for top_logprobs >= 1, each token with its "id"
    assert faulty_log.requests["llama-ids"]["top_logprobs"] == 1
    assert out.error is None and out.text == "<think"
    assert out.token_ids == [27, 11462] and out.logprobs == [-0.5, -0.125]


def test_logprobs_that_are_not_numbers_are_dropped_not_kept():
    from agentgym.engine.policies.http import _chat_logprobs

    nan = {"content": [{"id": 1, "logprob": float("nan")}]}
    text = {"content": [{"id": 1, "logprob": "low"}]}
    positive = {"content": [{"id": 1, "logprob": 0.5}]}
    assert _chat_logprobs(nan) == _chat_logprobs(text) == _chat_logprobs(positive) == (None, None)
    assert _chat_logprobs({"content": [{"token": "a", "logprob": -1}]}) == (None, [-1.0])
    assert _chat_logprobs({"content": [{"id": True, "logprob": -1}]}) == (None, [-1.0])


def test_usage_counts_that_are_not_numbers_are_missing(faulty_server, tmp_path):
    base, _ = faulty_server
    out = _act(f"{base}/badusage", retries=0)
    assert out.error is None and out.prompt_tokens is None and out.completion_tokens is None
    argv = f"eval Corridor-v0 --base-url {base}/badusage --tasks 1 --max-turns 2 --quiet"
    assert main([*argv.split(), "--out-dir", str(tmp_path)]) == 0
    env = json.loads((tmp_path / "results.json").read_text())["envs"]["AgentGym/Corridor-v0"]
    assert env["prompt_tokens"] is None and env["completion_tokens"] is None


def test_timeout_is_a_deadline_for_the_whole_request(faulty_server):
    base, _ = faulty_server
    started = time.monotonic()
    # one byte every 0.2 s: no single read waits a second, the whole reply takes ~30 s
    out = _act(f"{base}/trickle", timeout=1.0, retries=0)
    assert time.monotonic() - started < 5
    assert out.error_kind == "timeout" and "within 1 s" in out.error


def test_a_huge_reply_is_refused_not_recorded(faulty_server, tmp_path):
    base, _ = faulty_server
    out = _act(f"{base}/huge", retries=2)
    assert out.text == "" and out.error_kind == "bad_response" and "larger than" in out.error
    assert out.attempts == 1  # the same request would get the same reply
    argv = f"eval Corridor-v0 --base-url {base}/huge --tasks 1 --max-turns 2 --quiet"
    assert main([*argv.split(), "--out-dir", str(tmp_path)]) == 1
    assert (tmp_path / "trajectories.jsonl").stat().st_size < 100_000


def test_a_gzip_bomb_is_cut_off_without_inflating_it(faulty_server):
    base, _ = faulty_server
    # in a fresh process, so its peak memory is this request's alone
    script = (
        "import asyncio, resource, sys\n"
        "from agentgym.engine import OpenAIChatPolicy, SamplingParams\n"
        "p = OpenAIChatPolicy(sys.argv[1], model='faulty', retries=0, timeout=60)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = asyncio.run(p.act([{'role': 'user', 'content': 'hi'}], SamplingParams()))\n"
        "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(out.error_kind, grew // 1024, out.error)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", script, f"{base}/gzip"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    kind, grew_mb, error = (done.stdout.split(" ", 2) + ["", "", ""])[:3]
    assert kind == "bad_response" and "larger than" in error, done.stderr
    assert int(grew_mb) < 150  # the body inflates to 300 MB


def test_retry_after_is_honoured_on_429(faulty_server):
    base, _ = faulty_server
    started = time.monotonic()
    out = _act(f"{base}/busy-wait", retries=1, backoff=0.01)
    assert out.error is None and out.attempts == 2
    assert time.monotonic() - started >= 0.95  # the server asked for 1 s, not the 0.01 s backoff


def test_retry_after_forms():
    from agentgym.engine.policies.http import MAX_RETRY_AFTER_S, _retry_after

    assert _retry_after("2") == 2.0 and _retry_after("0.5") == 0.5
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert _retry_after("100000") == MAX_RETRY_AFTER_S
    assert _retry_after(None) is _retry_after("soon") is _retry_after("nan") is None


def test_an_abandoned_request_closes_its_connection(faulty_server, faulty_log):
    base, _ = faulty_server
    policy = OpenAIChatPolicy(f"{base}/hang-cancel", model="faulty", retries=0, timeout=60)

    async def go():
        task = asyncio.create_task(
            policy.act([{"role": "user", "content": "hi"}], SamplingParams())
        )
        await asyncio.sleep(0.5)
        task.cancel()  # as Ctrl-C or a cancelled run does
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled = time.monotonic()
        await asyncio.sleep(1.0)  # keep the client open: only the request is abandoned
        await policy.aclose()
        return cancelled

    cancelled = asyncio.run(go())
    assert "hang-cancel" in faulty_log.closed and faulty_log.closed["hang-cancel"] - cancelled < 0.5


def test_a_request_past_its_deadline_closes_its_connection(faulty_server, faulty_log):
    base, _ = faulty_server
    out = _act(f"{base}/hang-deadline", retries=0, timeout=0.5)
    assert out.error_kind == "timeout"
    deadline = time.monotonic() + 2
    while "hang-deadline" not in faulty_log.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "hang-deadline" in faulty_log.closed
