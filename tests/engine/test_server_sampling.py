"""Whether a real server samples each request at its own temperature, as ``--group-size k``
needs: ``transformers serve`` of the converted SmolLM2 does not (its generation_config.json
does not say ``do_sample``, and ``--continuous-batching`` gives every request the settings of
the first), and ``agentgym eval`` says so in its results instead of reporting pass@k = pass@1
as if it meant something."""

from __future__ import annotations

import json

from agentgym.cli import main


def test_a_server_that_ignores_the_temperature_is_flagged(smollm2_server, tmp_path, capsys):
    argv = [
        "eval", "Corridor-v0", "--base-url", smollm2_server, "--tasks", "1", "--group-size", "3",
        "--max-turns", "1", "--max-tokens", "16", "--temperature", "1", "--timeout", "300",
        "--concurrency", "3", "--out-dir", str(tmp_path), "--quiet",
    ]  # fmt: skip
    assert main(argv) == 0
    env = json.loads((tmp_path / "results.json").read_text())["envs"]["AgentGym/Corridor-v0"]
    texts = {
        json.loads(row)["turns"][0]["text"]
        for row in (tmp_path / "trajectories.jsonl").read_text().splitlines()
    }
    assert env["groups_compared"] == 1
    err = capsys.readouterr().err
    if len(texts) == 1:
        # three 16-token replies at temperature 1, all the same: served greedily (transformers
        # 5.24 with the converted folder, whose generation_config.json lacks do_sample)
        assert env["identical_groups"] == 1 and "not sampling" in env["warnings"][0]
        assert "not sampling" in err
    else:  # a server that samples is not flagged
        assert env["identical_groups"] == 0 and env["warnings"] == []
        assert "not sampling" not in err
