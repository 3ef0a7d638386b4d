"""``agentgym retrieval``: build search indexes and serve them.

agentgym retrieval index --corpus wiki-18.jsonl --kind flat --encoder DIR --out idx/e5-flat
agentgym retrieval index --corpus wiki-18.jsonl --kind bm25 --backend pyserini --out idx/bm25
agentgym retrieval serve --index idx/e5-flat --port 8000 --threads 4 --max-topk 50

``agentgym retrieval index --help`` and ``serve --help`` list every option with its default.
"""

from __future__ import annotations

import argparse
import sys


def cmd_index(args: argparse.Namespace) -> int:
    from agentgym.retrieval.build import build_index
    from agentgym.retrieval.corpus import CorpusFormatError

    try:
        meta = build_index(
            args.corpus,
            args.out,
            args.kind,
            encoder=args.encoder,
            backend=args.backend,
            shard_size=args.shard_size,
            force=args.force,
            device=args.device,
            batch_size=args.batch_size,
            show_progress=not args.quiet,
        )
    except (FileExistsError, FileNotFoundError, CorpusFormatError, ValueError) as e:
        # user errors (finished index without --force, missing corpus or encoder, a bad line,
        # changed settings on resume): one line, exit code 2 like argparse's usage errors
        print(f"agentgym retrieval index: error: {e}", file=sys.stderr)
        return 2
    where = f", {meta.dim}-d, encoder {meta.encoder}" if meta.dense else f", {meta.backend}"
    print(f"{meta.kind} index of {meta.num_docs} documents{where} -> {args.out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from agentgym.retrieval.build import read_meta

    try:
        read_meta(args.index)  # fail fast, in one line, before the server's imports
    except (FileNotFoundError, ValueError) as e:
        print(f"agentgym retrieval serve: error: {e}", file=sys.stderr)
        return 2
    problems = []
    if args.max_topk < 1:
        problems.append(f"--max-topk must be >= 1, got {args.max_topk}")
    if not 1 <= args.default_topk <= max(args.max_topk, 1):
        problems.append(
            f"--default-topk must be between 1 and --max-topk ({args.max_topk}), "
            f"got {args.default_topk}"
        )
    if args.threads is not None and args.threads < 1:
        problems.append(f"--threads must be >= 1, got {args.threads}")
    if args.max_batch < 1:
        problems.append(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.batch_wait_ms < 0:
        problems.append(f"--batch-wait-ms must be >= 0, got {args.batch_wait_ms}")
    for flag in ("max_queries", "max_results", "max_query_chars", "chunk_queries"):
        if getattr(args, flag) < 1:
            problems.append(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if not args.client_timeout_s > 0:
        problems.append(f"--client-timeout-s must be > 0, got {args.client_timeout_s}")
    if problems:
        for problem in problems:
            print(f"agentgym retrieval serve: error: {problem}", file=sys.stderr)
        return 2
    from agentgym.retrieval.server import serve

    serve(
        args.index,
        host=args.host,
        port=args.port,
        encoder=args.encoder,
        batch_wait_ms=args.batch_wait_ms,
        max_batch_queries=args.max_batch,
        adaptive_batch=not args.fixed_batch,
        max_topk=args.max_topk,
        default_topk=args.default_topk,
        max_queries_per_request=args.max_queries,
        max_results_per_request=args.max_results,
        max_query_chars=args.max_query_chars,
        chunk_queries=args.chunk_queries,
        client_timeout_s=args.client_timeout_s,
        threads=args.threads,
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``retrieval`` command and its sub-commands to the main parser.

    Every option's help ends with its default, where it has one.
    """
    p = sub.add_parser("retrieval", help="build search indexes and serve them over HTTP")
    rsub = p.add_subparsers(dest="retrieval_command", required=True)

    pi = rsub.add_parser(
        "index",
        help="build a BM25 or dense index of a JSONL corpus (resumable)",
        description="Build a search index of a Search-R1-format corpus (one "
        '{"id", "contents"} JSON object per line). Rerunning a killed build resumes it from '
        "its last finished shard; DIR/meta.json marks a finished index.",
    )
    pi.add_argument("--corpus", required=True, help="JSONL corpus (plain or .gz)")
    pi.add_argument(
        "--kind",
        choices=["flat", "hnsw", "ivfpq", "bm25"],
        default="flat",
        help="flat, hnsw, ivfpq: dense (FAISS, needs an encoder); bm25: sparse "
        "(default: %(default)s)",
    )
    pi.add_argument(
        "--encoder",
        default=None,
        help="dense kinds: a sentence-transformers / transformers folder, or a hub name already "
        "in the local cache (default: intfloat/e5-base-v2)",
    )
    pi.add_argument(
        "--backend",
        choices=["bm25s", "pyserini"],
        default="bm25s",
        help="bm25 only (default: %(default)s)",
    )
    pi.add_argument("--out", required=True, help="index directory")
    pi.add_argument("--force", action="store_true", help="rebuild over a finished index")
    pi.add_argument(
        "--shard-size",
        type=int,
        default=50_000,
        help="records per resumable shard (default: %(default)s)",
    )
    pi.add_argument(
        "--batch-size", type=int, default=256, help="encoder batch size (default: %(default)s)"
    )
    pi.add_argument(
        "--device", default=None, help="encoder device (default: cuda if available, else cpu)"
    )
    pi.add_argument("--quiet", action="store_true", help="no progress bars or loading messages")
    pi.set_defaults(func=cmd_index)

    ps = rsub.add_parser(
        "serve",
        help="serve an index over HTTP (POST /retrieve)",
        description="Serve an index with Search-R1's /retrieve protocol. The server has no "
        "authentication: keep the default loopback --host unless a firewall or an "
        "authenticating proxy guards the port.",
    )
    ps.add_argument("--index", required=True, help="index directory built by `retrieval index`")
    ps.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; any other than loopback is reachable by others, with no "
        "authentication (default: %(default)s)",
    )
    ps.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default: %(default)s)"
    )
    ps.add_argument(
        "--encoder",
        default=None,
        help="dense: override the index's query encoder (default: the one it was built with)",
    )
    ps.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="hold a batch open this long for more requests; 0: a batch goes out as soon as the "
        "previous search ends, under load that already makes large batches (default: "
        "%(default)s)",
    )
    ps.add_argument(
        "--max-batch",
        type=int,
        default=512,
        help="most queries of several requests merged into one search; 1: no merging "
        "(default: %(default)s)",
    )
    ps.add_argument(
        "--fixed-batch",
        action="store_true",
        help="always merge up to --max-batch queries, even for a retriever (BM25) whose measured "
        "cost says large batches gain nothing",
    )
    ps.add_argument(
        "--max-topk",
        type=int,
        default=100,
        help="largest topk a request may ask for (default: %(default)s)",
    )
    ps.add_argument(
        "--default-topk",
        type=int,
        default=3,
        help="topk of requests that leave it out (default: %(default)s)",
    )
    ps.add_argument(
        "--max-queries",
        type=int,
        default=4096,
        help="most queries in one request; more is a 413 (default: %(default)s)",
    )
    ps.add_argument(
        "--max-results",
        type=int,
        default=65_536,
        help="most results (queries x topk) in one request; more is a 413 (default: %(default)s)",
    )
    ps.add_argument(
        "--max-query-chars",
        type=int,
        default=4096,
        help="longest query string; longer is a 413 (default: %(default)s)",
    )
    ps.add_argument(
        "--chunk-queries",
        type=int,
        default=64,
        help="a request with more queries is searched in chunks of this many, taking turns with "
        "other requests so that it never stalls them (default: %(default)s)",
    )
    ps.add_argument(
        "--client-timeout-s",
        type=float,
        default=30.0,
        help="a connection that sends no complete request within this long (after connecting, "
        "or after its last answer) is closed (default: %(default)s)",
    )
    ps.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch and FAISS compute threads (default: the libraries' own, one per core)",
    )
    ps.set_defaults(func=cmd_serve)
