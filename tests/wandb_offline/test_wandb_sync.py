"""What ``wandb sync`` uploads from a resumed run's offline segments: the real ``wandb sync`` command (the pinned
wandb's client and wandb-core) against a small stand-in for the W&B server on 127.0.0.1.

The server is a stand-in because W&B's server cannot run here (no network). It answers the GraphQL calls a sync
makes (RunResumeStatus, UpsertBucket, CreateRunFiles, ...) and keeps each run's history as the file stream
sends it (``offset`` + lines), as the server does. Tables are left out: uploading one takes W&B's artifact
API, which the stand-in does not speak. What the test checks is the client's side: that the segments of one
run go up as one run, every step once, in order, and the summary names the best accuracy of the whole run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from support.config import ROOT
from support.wandb_runs import start, wandb_cfg

pytestmark = pytest.mark.slow  # four child processes: about 70 s at load 10 on 2 cores


class StandIn(ThreadingHTTPServer):
    """History, summary and metadata per run name, as the client sends them."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.runs: dict[str, dict] = {}
        self.upserts: list[dict] = []

    def run(self, name: str) -> dict:
        return self.runs.setdefault(name, {"history": [], "summary": "{}", "config": "{}"})


def bucket(server: StandIn, name: str, project: str) -> dict:
    r = server.run(name)
    tail = json.dumps(r["history"][-1:])
    return {
        "id": "b-" + name,
        "name": name,
        "displayName": name,
        "summaryMetrics": r["summary"],
        "config": r["config"],
        "historyLineCount": len(r["history"]),
        "historyTail": tail,
        "eventsLineCount": 0,
        "eventsTail": "[]",
        "logLineCount": 0,
        "tags": [],
        "wandbConfig": json.dumps({"t": 1}),
        "project": {"id": "p", "name": project, "entity": {"id": "e", "name": "me"}},
    }


def graphql(server: StandIn, op: str, v: dict) -> dict:
    model = {"id": "p", "name": v.get("project"), "entity": {"id": "e", "name": "me"}}
    if op == "RunResumeStatus":
        found = v["name"] in server.runs
        return {"model": {**model, "bucket": bucket(server, v["name"], v.get("project")) if found else None}}
    if op == "UpsertBucket":
        server.upserts.append(v)
        if v.get("config"):
            server.run(v["name"])["config"] = v["config"]
        return {"upsertBucket": {"inserted": True, "bucket": bucket(server, v["name"], v.get("project") or "p")}}
    if op == "CreateRunFiles":
        port = server.server_address[1]
        files = [{"name": n, "uploadUrl": f"http://127.0.0.1:{port}/upload/{n}"} for n in v.get("files", [])]
        return {"createRunFiles": {"runID": "b", "uploadHeaders": [], "files": files}}
    if op == "ServerFeaturesQuery":
        return {"serverInfo": {"features": []}}
    return {}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply({})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path.startswith("/graphql"):
            self.reply({"data": graphql(self.server, body.get("operationName", ""), body.get("variables") or {})})
            return
        if self.path.endswith("/file_stream"):  # /files/<entity>/<project>/<run>/file_stream
            run = self.server.run(self.path.split("/")[-2])
            files = body.get("files", {})
            if "wandb-history.jsonl" in files:
                h = files["wandb-history.jsonl"]
                run["history"][h["offset"] : h["offset"] + len(h["content"])] = h["content"]
            if "wandb-summary.json" in files:
                run["summary"] = files["wandb-summary.json"]["content"][-1]
        self.reply({})


def test_wandb_sync_uploads_the_resumed_segments_as_one_run(tmp_path):
    cfg = wandb_cfg()
    run_dir = tmp_path / "run"
    assert start(run_dir, cfg, 0, 3, tables=False) == 0  # pre-empted after step 3 (checkpoint 3)
    assert start(run_dir, cfg, 4, 7, resume=3, kill=True, tables=False) != 0  # kill -9 at step 7 (checkpoint 5)
    assert start(run_dir, cfg, 6, 10, resume=5, tables=False) == 0
    server = StandIn()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(WANDB_BASE_URL=f"http://127.0.0.1:{server.server_address[1]}", WANDB_API_KEY="x" * 40, WANDB_DIR=str(tmp_path))
    try:
        p = subprocess.run(
            [sys.executable, "-m", "wandb", "sync", str(run_dir / "wandb")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        server.shutdown()
    assert p.returncode == 0 and "ERROR" not in p.stderr, p.stderr[-3000:]
    (name,) = server.runs  # one W&B run
    rows = [json.loads(line) for line in server.runs[name]["history"]]
    assert [r["_step"] for r in rows] == list(range(11))  # every step once, in order, none renumbered
    assert all(r["train_time"] == 1.5 * r["_step"] for r in rows)
    summary = json.loads(server.runs[name]["summary"])
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert summary["best/accuracy"] == max(evals) and summary["final/accuracy"] == evals[-1]
    meta = [u for u in server.upserts if u.get("jobType")]
    assert meta and {u["jobType"] for u in meta} == {"grpo_pods"} and all("mine" in u["tags"] for u in meta)
