"""Async against lockstep rollouts: the same episodes against the same real batching server.

The server is llama.cpp's ``llama-server`` (``--server llama``, started by
:class:`agentgym.engine.LlamaServer` with the suite's SmolLM2-135M-Instruct GGUF, one thread,
``--slots`` parallel slots) or ``transformers serve <SmolLM2 folder> --device cpu
--continuous-batching`` (``--server transformers``), on 127.0.0.1. The same episodes are played
with :class:`agentgym.engine.RolloutEngine` twice per repeat, once async (every episode its own
coroutine) and once in lockstep (generate for every active episode, then step every one),
greedy so both arms see the same model text, with the sampled token ids and log-probs recorded
(where the server returns them: llama.cpp does). Both arms get the same request limit and the
same number of episodes running at once (``--concurrency``).

Two settings, interleaved repeat by repeat (async, lockstep, lockstep, async, ...) so both arms
of each comparison see the same machine load:

- ``varied``: episode lengths vary; each episode gets its own step cap (gymnasium's
  ``max_episode_steps``), drawn once from ``--caps`` (the model almost never finishes an
  episode on its own, so the cap is what sets the length, as a long ALFWorld game would);
- ``uniform``: every episode the same cap (the mean of the varied caps, rounded).

Prompts: the env family's template (``--template family``), or the bundled trainer's compact one
(``--template compact``: the observation after the recent steps, no preamble or instruction);
with ``--history-length 0`` every prompt then starts with the chat template's preamble, which
llama.cpp keeps cached in each slot, so a turn processes only its new observation's tokens.

Per run: wall time, CPU time (the server's and this process's), llama-server's counts of prompt
tokens processed and reused from a slot's cache and of ``llama_decode`` calls (``--metrics``),
requests in flight over time (sampled every 0.25 s) with the time-weighted mean and peak, and
where the time goes: per episode, time waiting for and in generation, time in env steps, and the
rest (waiting on the other episodes of a lockstep round).

    python benchmarks/bench_async_rollout.py --server llama --llama-server PATH   # ~10 min
    python benchmarks/bench_async_rollout.py --server transformers                # ~6-10 min
    python benchmarks/bench_async_rollout.py --server llama --quick               # a smoke run
    python benchmarks/bench_async_rollout.py --server llama --model F16.gguf ...  # another GGUF
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from agentgym.engine import Policy

REPO = Path(__file__).resolve().parents[1]


CB_FLAGS = ["--cb-block-size", "32", "--cb-num-blocks", "256", "--cb-max-batch-tokens", "2048"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``), 0 where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def start_llama(
    binary: str, model: str | None, slots: int, threads: int, log: Path, extra: list[str]
) -> tuple[Any, str, list]:
    """``llama-server`` on loopback with ``model`` (a GGUF file; None: the suite's SmolLM2
    GGUF); (server, base URL, the command)."""
    from agentgym.engine import LlamaServer, LlamaServerError

    # no prompt cache in RAM, and slots that can be erased: every run starts cold, so neither
    # arm reuses the prompts the other arm's run (the same greedy episodes) left behind
    cold = ["--cache-ram", "0", "--slot-save-path", str(log.parent)]
    # /metrics: prompt tokens processed and reused from a slot's cache, read around each run
    cold.append("--metrics")
    server = LlamaServer(
        binary, model, slots=slots, threads=threads, log_path=log, extra_args=[*cold, *extra]
    )
    try:
        server.start()
    except LlamaServerError as exc:
        sys.exit(str(exc))
    return server, server.base_url, server.command


def llama_counters(url: str) -> dict[str, float]:
    """llama-server's token counters so far (``GET /metrics``): prompt tokens processed
    (``prompt_tokens``), prompt tokens reused from a slot's cache (``prompt_tokens_cached``),
    tokens generated (``tokens_predicted``) and ``llama_decode`` calls (``decode_calls``)."""
    names = {
        "llamacpp:prompt_tokens_total": "prompt_tokens",
        "llamacpp:prompt_tokens_cached_total": "prompt_tokens_cached",
        "llamacpp:tokens_predicted_total": "tokens_predicted",
        "llamacpp:n_decode_total": "decode_calls",
    }
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[names[name]] = float(value)
    return out


#: The bundled trainer's ``compact`` prompt (``trainers.gigpo.rollout.COMPACT_TEMPLATE``): the
#: observation, after the recent (observation, action) pairs; no preamble, no format instruction.
COMPACT = {"first": "{observation}", "later": "{history}\n{observation}"}


def erase_slots(url: str, slots: int) -> None:
    """Empty every llama-server slot (its cached prompt and KV), so the next run starts cold."""
    for slot in range(slots):
        request = urllib.request.Request(f"{url}/slots/{slot}?action=erase", b"", method="POST")
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()


def start_server(folder: Path, threads: int, log: Path, extra: list[str]) -> tuple[Any, str, list]:
    """``transformers serve`` on loopback; (process, base URL, the command)."""
    exe = shutil.which("transformers")
    if exe is None:
        sys.exit("the `transformers` command is not installed: pip install transformers")
    port = _free_port()
    cmd = [exe, "serve", str(folder), "--device", "cpu", "--host", "127.0.0.1"]
    # Without an explicit KV-cache size continuous batching sizes its paged cache from memory
    # meant for a GPU: on CPU the server grew to 14 GB and was killed for memory. 256 blocks of
    # 32 tokens hold 8,192 tokens (~0.4 GB for SmolLM2-135M), far more than the runs need.
    cmd += ["--port", str(port), "--continuous-batching", *CB_FLAGS, *extra]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    out = log.open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            sys.exit(f"transformers serve exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as reply:
                if reply.status == 200:
                    return proc, url, cmd
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"transformers serve did not answer in 300 s: {log.read_text()[-2000:]}")
        time.sleep(1.0)


class Recorded(Policy):
    """A policy that records each request's start and end (seconds since :meth:`reset`)."""

    def __init__(self, inner):
        self.inner = inner
        self.plain_actions = inner.plain_actions
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.spans: list[tuple[float, float]] = []

    async def act(self, messages, params, info=None):
        start = time.perf_counter() - self.t0
        try:
            return await self.inner.act(messages, params, info)
        finally:
            self.spans.append((start, time.perf_counter() - self.t0))

    async def aclose(self) -> None:
        await self.inner.aclose()

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def in_flight_timeline(spans: list[tuple[float, float]], step: float) -> list[int]:
    """Requests in flight at t = 0, step, 2*step, ... until the last one ends."""
    end = max((e for _, e in spans), default=0.0)
    return [
        sum(1 for s, e in spans if s <= t < e)
        for t in (i * step for i in range(int(end / step) + 1))
    ]


def episodes(env_id: str, caps: list[int], seed: int):
    from agentgym.engine import EpisodeSpec

    return [
        EpisodeSpec(env_id, task=i, seed=seed + i, group=i, env_kwargs={"max_episode_steps": c})
        for i, c in enumerate(caps)
    ]


def run_once(url: str, specs, args, lockstep: bool, server_pid: int) -> dict[str, Any]:
    from agentgym.engine import OpenAIChatPolicy, RolloutEngine, SamplingParams

    # a fresh client per run: its connections belong to this run's event loop
    policy = Recorded(OpenAIChatPolicy(url, logprobs=True, timeout=600, retries=2))

    make_env = None
    if args.template == "compact":
        from agentgym.family import PromptTemplate
        from agentgym.wrappers.llm import make_llm_env

        template = PromptTemplate(**COMPACT)

        def make_env(spec):
            return make_llm_env(
                spec.env_id, None, args.history_length, template, env_kwargs=spec.env_kwargs
            )

    engine = RolloutEngine(
        policy,
        SamplingParams(0.0, 1.0, args.max_tokens),
        concurrency=args.concurrency,
        max_active=args.concurrency,
        lockstep=lockstep,
        history_length=args.history_length,
        make_env=make_env,
    )
    load = os.getloadavg()[0]

    async def go():
        policy.reset()
        try:
            return await engine.run(specs)
        finally:
            await policy.aclose()

    counters: dict[str, float] = {}
    if args.server == "llama":
        erase_slots(url, args.slots or args.concurrency)
        counters = llama_counters(url)
    server_cpu, client_cpu = cpu_seconds(server_pid), time.process_time()
    records = asyncio.run(go())
    server_cpu, client_cpu = cpu_seconds(server_pid) - server_cpu, time.process_time() - client_cpu
    if counters:
        after = llama_counters(url)
        counters = {k: after[k] - v for k, v in counters.items() if k in after}
    engine.close()
    stats = engine.stats
    gen = [sum(t.latency_s for t in r.turns) for r in records]
    env = [sum(t.step_s for t in r.turns) for r in records]
    waits = [max(0.0, r.wall_s - g - e) for r, g, e in zip(records, gen, env, strict=True)]
    spans = policy.spans
    tokens = sum(t.completion_tokens or 0 for r in records for t in r.turns)
    return {
        "mode": "lockstep" if lockstep else "async",
        "wall_s": stats.wall_s,
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
        "turns": stats.turns,
        "turns_with_token_ids_and_logprobs": sum(
            bool(t.token_ids) and len(t.token_ids) == len(t.logprobs or ())
            for r in records
            for t in r.turns
        ),
        "requests": stats.requests,
        "completion_tokens": tokens,
        "prompt_tokens": sum(t.prompt_tokens or 0 for r in records for t in r.turns),
        # llama.cpp: the prompt tokens it processed and those it reused from a slot's cache
        "server_counters": counters,
        "tokens_per_s": tokens / stats.wall_s if stats.wall_s else 0.0,
        "errors": stats.errors,
        "end_reasons": {
            k: sum(1 for r in records if r.end_reason == k)
            for k in sorted({r.end_reason for r in records})
        },
        "in_flight_mean": stats.mean_in_flight,
        "in_flight_peak": stats.max_in_flight,
        "in_flight_timeline": in_flight_timeline(spans, args.sample_s),
        "request_latency_median_s": statistics.median(e - s for s, e in spans) if spans else None,
        # per episode, summed: generation (queueing for a request slot included), env steps,
        # and the rest of its wall time (lockstep: waiting on the round's other episodes)
        "episode_generation_s": sum(gen),
        "episode_env_s": sum(env),
        "episode_waiting_s": sum(waits),
        "episode_wall_s": sum(r.wall_s for r in records),
        "load_average_1m": load,
        "actions": [[t.text for t in r.turns] for r in records],
    }


def batching_probe(url: str, n: int, max_tokens: int, server_pid: int) -> dict[str, Any]:
    """Wall time and server CPU time of one request alone, then of ``n`` identical ones sent at
    once: whether (and how much) the server batches concurrent requests on this machine (CPU
    time is the figure other work on the cores does not move)."""
    from agentgym.engine import OpenAIChatPolicy, SamplingParams

    messages = [{"role": "user", "content": "Name three colours, one per line."}]
    params = SamplingParams(0.0, 1.0, max_tokens)
    errors: list[str] = []

    async def go(k: int) -> float:
        policy = OpenAIChatPolicy(url, logprobs=False, timeout=600, retries=2)
        try:
            started = time.perf_counter()
            outs = await asyncio.gather(*(policy.act(messages, params) for _ in range(k)))
            wall = time.perf_counter() - started
            errors.extend(o.error for o in outs if o.error)
            return wall
        finally:
            await policy.aclose()

    cpu0 = cpu_seconds(server_pid)
    one = asyncio.run(go(1))
    cpu1 = cpu_seconds(server_pid)
    many = asyncio.run(go(n))
    cpu2 = cpu_seconds(server_pid)
    return {
        "one_request_s": one,
        f"{n}_requests_at_once_s": many,
        "throughput_gain": n * one / many,
        "one_request_server_cpu_s": cpu1 - cpu0,
        f"{n}_requests_at_once_server_cpu_s": cpu2 - cpu1,
        "errors": errors,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", choices=["llama", "transformers"], default="llama")
    ap.add_argument(
        "--llama-server",
        default=os.environ.get("AGENTGYM_LLAMA_SERVER"),
        help="the llama-server binary ($AGENTGYM_LLAMA_SERVER)",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="llama: a GGUF file (default: the suite's SmolLM2-135M-Instruct Q4_1 GGUF)",
    )
    ap.add_argument("--slots", type=int, default=None, help="llama-server slots (--concurrency)")
    ap.add_argument("--env", default="AgentGym/Corridor-v0")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument(
        "--caps",
        default="1,6,1,4,1,6,2,3",
        help="'varied': episode i's step cap is the i-th (cycled)",
    )
    ap.add_argument("--concurrency", type=int, default=8, help="requests and episodes at once")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--history-length", type=int, default=1)
    ap.add_argument(
        "--template",
        choices=["family", "compact"],
        default="family",
        help="prompt template: the env family's, or the trainer's compact one",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="server's threads (-t, or OMP)")
    ap.add_argument("--settings", default="varied,uniform")
    ap.add_argument("--sample-s", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra server flag")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "async_rollout.json"))
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.caps, args.repeats, args.max_tokens = 4, "1,3,1,2", 1, 8
    if args.server == "llama" and not args.llama_server:
        sys.exit("--server llama needs --llama-server PATH (or $AGENTGYM_LLAMA_SERVER)")

    from agentgym.models import model_path

    pool = [int(c) for c in args.caps.split(",")]
    varied = [pool[i % len(pool)] for i in range(args.episodes)]
    uniform = [round(statistics.mean(varied))] * args.episodes
    settings = {"varied": varied, "uniform": uniform}
    settings = {k: settings[k] for k in args.settings.split(",")}

    log = Path(tempfile.mkdtemp(prefix="agentgym-serve-")) / "serve.log"
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    if args.server == "llama":
        from agentgym.models import gguf_file

        folder = Path(args.model) if args.model else gguf_file("smollm2-135m")
        server, url, cmd = start_llama(
            args.llama_server,
            args.model,
            args.slots or args.concurrency,
            args.threads,
            log,
            args.serve_arg,
        )
        pid = server.pid
    else:
        folder = model_path("smollm2-135m")
        server, url, cmd = start_server(folder, args.threads, log, args.serve_arg)
        pid = server.pid
    start_s = time.perf_counter() - t0
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in settings}
    try:
        # warm-up: the first request pays for lazy setup on the server
        run_once(url, episodes(args.env, [1], args.seed + 1000), args, False, pid)
        probe = batching_probe(url, args.concurrency, args.max_tokens, pid)
        print(f"batching probe: {probe}", file=sys.stderr, flush=True)
        for rep in range(args.repeats):
            for name, caps in settings.items():
                order = [False, True] if rep % 2 == 0 else [True, False]
                for lockstep in order:
                    result = run_once(url, episodes(args.env, caps, args.seed), args, lockstep, pid)
                    result["repeat"] = rep
                    runs[name].append(result)
                    print(
                        f"[{name} rep {rep}] {result['mode']:<8} {result['wall_s']:6.1f} s  "
                        f"cpu {result['server_cpu_s']:6.1f} s  in flight "
                        f"{result['in_flight_mean']:.2f}  load {result['load_average_1m']:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if args.server == "llama":
            server.stop()
        else:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()

    summary: dict[str, Any] = {}
    for name, results in runs.items():
        by = {m: [r for r in results if r["mode"] == m] for m in ("async", "lockstep")}
        med = {m: statistics.median(r["wall_s"] for r in rs) for m, rs in by.items()}
        pairs = [
            lock["wall_s"] / asy["wall_s"]
            for asy in by["async"]
            for lock in by["lockstep"]
            if asy["repeat"] == lock["repeat"]
        ]
        same = sum(
            a["actions"] == b["actions"]
            for a in by["async"]
            for b in by["lockstep"]
            if a["repeat"] == b["repeat"]
        )
        summary[name] = {
            "caps": settings[name],
            "total_turn_cap": sum(settings[name]),
            "wall_s_median": med,
            "speedup_lockstep_over_async": med["lockstep"] / med["async"],
            "server_cpu_s_median": {
                m: statistics.median(r["server_cpu_s"] for r in rs) for m, rs in by.items()
            },
            "client_cpu_s_median": {
                m: statistics.median(r["client_cpu_s"] for r in rs) for m, rs in by.items()
            },
            "turns_with_token_ids_and_logprobs": {
                m: f"{sum(r['turns_with_token_ids_and_logprobs'] for r in rs)} of "
                f"{sum(r['turns'] for r in rs)}"
                for m, rs in by.items()
            },
            "speedup_per_repeat": pairs,
            "in_flight_mean_median": {
                m: statistics.median(r["in_flight_mean"] for r in rs) for m, rs in by.items()
            },
            "time_split_median": {
                m: {
                    k: statistics.median(r[f"episode_{k}_s"] / r["episode_wall_s"] for r in rs)
                    for k in ("generation", "env", "waiting")
                }
                for m, rs in by.items()
            },
            "request_latency_median_s": {
                m: statistics.median(r["request_latency_median_s"] for r in rs)
                for m, rs in by.items()
            },
            "tokens_per_s_median": {
                m: statistics.median(r["tokens_per_s"] for r in rs) for m, rs in by.items()
            },
            "repeats_with_identical_actions": f"{same} of {len(pairs)}",
        }
        if all(r["server_counters"] for r in results):
            summary[name]["server_counters_median"] = {
                m: {
                    k: statistics.median(r["server_counters"][k] for r in rs)
                    for k in rs[0]["server_counters"]
                }
                for m, rs in by.items()
            }
        print(
            f"{name}: async {med['async']:.1f} s, lockstep {med['lockstep']:.1f} s, "
            f"lockstep/async {med['lockstep'] / med['async']:.2f}x",
            file=sys.stderr,
        )
    for results in runs.values():
        for r in results:
            r.pop("actions")
    server_name = (
        "llama.cpp llama-server"
        if args.server == "llama"
        else "transformers serve --continuous-batching"
    )
    report = {
        "benchmark": f"async vs lockstep rollouts against {server_name}",
        "command": "python benchmarks/bench_async_rollout.py " + " ".join(sys.argv[1:]),
        "server": {
            "kind": args.server,
            "command": " ".join([Path(cmd[0]).name, *cmd[1:]]),
            "env": {"OMP_NUM_THREADS": args.threads, "MKL_NUM_THREADS": args.threads},
            "start_s": start_s,
            "batching_probe": probe,
        },
        "model": str(folder),
        "env_id": args.env,
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "max_active": args.concurrency,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "history_length": args.history_length,
        "template": args.template,
        "repeats": args.repeats,
        "sample_s": args.sample_s,
        "cpus": os.cpu_count(),
        "load_average_1m_start": load_start,
        "load_average_1m_end": os.getloadavg()[0],
        "python": platform.python_version(),
        "summary": summary,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    os.replace(tmp, out)
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
