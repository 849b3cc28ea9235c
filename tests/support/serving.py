"""A real server for the end-to-end tests, and the client calls they make (loopback only).

The server is the README's command, ``bash scripts/serve.sh`` (extra arguments are
``vllm serve`` flags), in its own process group, its log in a file; it is stopped by
SIGTERM to that group (SIGKILL after ``STOP_TIMEOUT_S``). It runs eagerly unless a test asks
for the shipped settings unchanged (``compiled=True``): see ``EAGER``.
"""

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import time

import requests

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY_MODEL_DIR = str(REPO / "configs" / "tiny-models" / "qwen3_5-dense")
TINY_SERVED_NAME = "qwen3_5-tiny"  # scripts/serve.sh without MODEL
START_TIMEOUT_S = 300
STOP_TIMEOUT_S = 30
REQUEST_TIMEOUT_S = 300
# configs/serve-cpu.yaml serves in vLLM's compiled mode, whose start-up compiles the decoder
# (about twice an eager start). The suite starts many servers and has a fixed time budget, so
# they run eagerly: the flag wins over the config file. The compiled server has tests of its own
# (tests/e2e/test_compiled_server.py); the compiled model's ids, tests/e2e/test_compiled_mode.py.
EAGER = ("--enforce-eager",)


@dataclasses.dataclass(frozen=True)
class Server:
    base: str  # http://127.0.0.1:PORT
    pgid: int  # process group of serve.sh and every process vLLM starts
    log_path: pathlib.Path
    model: str  # the served model name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_server(log_path: pathlib.Path, *args: str, model: str = TINY_SERVED_NAME, env: dict | None = None,
                   unset: tuple[str, ...] = (), cwd: pathlib.Path = REPO, compiled: bool = False):
    """``bash scripts/serve.sh --port <free> [--enforce-eager] *args`` run from ``cwd`` with ``env`` and
    without the variables ``unset``, healthy, stopped on exit; ``compiled``: the shipped mode, not ``EAGER``."""
    port = free_port()
    command = ["bash", str(REPO / "scripts" / "serve.sh"), "--port", str(port), *(() if compiled else EAGER), *args]
    with serving_process(command, port, log_path, model=model, env=env, unset=unset, cwd=cwd) as server:
        yield server


@contextlib.contextmanager
def serving_process(command: list[str], port: int, log_path: pathlib.Path, *, model: str, env: dict | None = None,
                    unset: tuple[str, ...] = (), cwd: pathlib.Path = REPO):
    """``command`` (a server listening on loopback ``port``) run in its own process group from ``cwd``
    with ``env`` and without the variables ``unset``, its log in ``log_path``; healthy, stopped on exit."""
    full_env = {**os.environ, **(env or {})}
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", *unset):  # the production process layout; the user's env
        full_env.pop(name, None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {START_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield Server(base=base, pgid=proc.pid, log_path=log_path, model=model)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def completion(server: Server, **body) -> dict:
    """A non-streaming ``/v1/completions`` answer (greedy, EOS ignored unless ``body`` says otherwise)."""
    body = {"model": server.model, "temperature": 0.0, "ignore_eos": True, **body}
    response = requests.post(f"{server.base}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 200, response.text
    return response.json()


def stream_events(server: Server, path: str, body: dict):
    """The decoded ``data:`` events of a streaming request, until ``[DONE]``."""
    body = {"model": server.model, "temperature": 0.0, "ignore_eos": True, "stream": True, **body}
    with requests.post(f"{server.base}{path}", json=body, stream=True, timeout=REQUEST_TIMEOUT_S) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                yield json.loads(line[len(b"data: "):])


def generated_ids(server: Server, request: dict) -> list[int]:
    """The token ids a completion ``request`` (``stream`` true or not) generates."""
    body = {**request, "return_token_ids": True}
    if not body.pop("stream", False):
        return completion(server, **body)["choices"][0]["token_ids"]
    ids: list[int] = []
    for event in stream_events(server, "/v1/completions", body):
        for choice in event["choices"]:
            ids.extend(choice.get("token_ids") or [])
    return ids


def all_at_once(server: Server, batch: list[dict], workers: int) -> list[list[int]]:
    """:func:`generated_ids` of every request of ``batch``, ``workers`` clients at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda request: generated_ids(server, request), batch))


def mixed_requests(count: int, seed: int, max_prompt: int = 1500, vocab_size: int = 512) -> list[dict]:
    """``count`` completion requests: prompts of 1 to ``max_prompt`` random ids, 1-16 new
    tokens, every other one streaming."""
    rng = random.Random(seed)
    lengths = [1, 2, max_prompt] + [rng.randint(1, max_prompt) for _ in range(count - 3)]
    rng.shuffle(lengths)
    return [
        {
            "prompt": [rng.randrange(3, vocab_size) for _ in range(n)],
            "max_tokens": rng.randint(1, 16),
            "stream": bool(i % 2),
        }
        for i, n in enumerate(lengths[:count])
    ]


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([0-9.eE+-]+|NaN|[+-]Inf)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric(server: Server, name: str, **labels: str) -> float:
    """The sum of one Prometheus series of ``/metrics`` over the samples with ``labels`` (0 when absent)."""
    total = 0.0
    for line in requests.get(f"{server.base}/metrics", timeout=30).text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        sample_labels = dict(_LABEL.findall(match.group(2) or ""))
        if all(sample_labels.get(key) == value for key, value in labels.items()):
            total += float(match.group(3))
    return total


def wait_idle(server: Server, timeout_s: float = 60.0) -> None:
    """Wait until the engine runs and queues no request (its slots are free)."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = metric(server, "vllm:num_requests_running") + metric(server, "vllm:num_requests_waiting")
        if busy == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{busy:.0f} requests still running or waiting after {timeout_s} s")
        time.sleep(0.5)


def resident_by_process(pgid: int) -> dict[str, int]:
    """Resident memory (VmRSS, bytes) of each process in the process group ``pgid``, by ``name pid``."""
    sizes = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
            if int(tail.split()[2]) != pgid:
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        if match:
            sizes[f"{head.split('(', 1)[1]} {stat.parent.name}"] = int(match.group(1)) * 1024
    return sizes


def resident_bytes(pgid: int) -> int:
    """Resident memory (VmRSS) of every process in the process group ``pgid``."""
    return sum(resident_by_process(pgid).values())
