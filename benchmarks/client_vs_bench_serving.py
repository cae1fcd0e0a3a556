"""CPU per output token: `sglperf bench` beside SGLang's own client (`sglang.benchmark.serving`), same server.

    python benchmarks/client_vs_bench_serving.py --sglang-python /tmp/sgl/bin/python [--concurrency 16]

Both clients stream SGLang's native /generate from the simulator's `ci` preset, sped up by --time-scale (token ids
in, 32 + 32 tokens, closed loop at --concurrency, ignore_eos); sglperf with uvloop and with asyncio's own loop.
Each runs twice, short and long, and the table gives the *marginal* CPU:
(CPU of the long run - CPU of the short one) / (tokens of the long - tokens of the short), so interpreter start-up,
imports and tokenizer loading cancel out. CPU is the client process's user + system time (its children's rusage);
bench_serving's from the start of its run_benchmark (importing SGLang's torch varies by a second or more). The
clients take turns for --repeat rounds and the medians are compared. Run on a quiet machine; the ratio is what to
read, the absolute µs depend on the CPU.
The last row is the floor (raw_stream_floor.py): a uvloop Protocol that only counts SSE events, no parser, no JSON,
no records; what is left between it and sglperf is what sglperf's own Python does per token.

SGLang 0.5.23 in its own venv, CPU only (no GPU needed for its client), as README.md says under "The load generator".
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglperf.run.launch import LaunchSpec, launch

ISL = OSL = 32


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, standard output) of one client run."""
    c0, t0 = child_cpu(), time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return child_cpu() - c0, time.monotonic() - t0, p.stdout


def word_tokenizer(where: Path) -> Path:
    """A word-level Hugging Face tokenizer: bench_serving needs one to make its random-ids prompts; no downloads."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(32000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    where.mkdir(parents=True, exist_ok=True)
    tok.save(str(where / "tokenizer.json"))
    (where / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                             "unk_token": "[UNK]"}))
    return where


def sglperf_run(url: str, c: int, seconds: float, tmp: Path, loop: str) -> tuple[float, int, float]:
    records = tmp / f"records-{seconds:g}-{loop}.jsonl"
    cpu, wall, _ = timed(["env", f"SGLPERF_EVENT_LOOP={loop}", sys.executable, "-m", "sglperf.cli", "bench", "--url",
                          url, "--engine", "sim", "--levels", str(c), "--isl", str(ISL), "--osl", str(OSL),
                          "--min-seconds", str(seconds), "--max-seconds", str(seconds), "--no-flush", "--records",
                          str(records)])
    tokens = sum(sum(json.loads(line)["chunk_tokens"]) for line in records.read_text().splitlines() if line)
    return cpu, tokens, wall


def floor_run(url: str, c: int, seconds: float) -> tuple[float, int, float]:
    """The raw floor (raw_stream_floor.py): a Protocol that only counts events, on the same server."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("raw_stream_floor.py")), "--url", url,
                        "--seconds", str(seconds), "--concurrency", str(c), "--isl", str(ISL), "--osl", str(OSL)],
                       capture_output=True, text=True, timeout=900, check=True)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    return doc["user_s"] + doc["sys_s"], int(doc["events"]), time.monotonic() - t0


# bench_serving's CPU is counted from the start of its run_benchmark (tokenizer, prompts, requests, metrics), not from
# the interpreter's: importing SGLang (torch) costs ~10 CPU-s that vary by a second or more from run to run, noise
# that once moved its marginal figure from 25 to 39 µs per token between two invocations of this script.
BENCH_SERVING = """
import json, resource, sys
import sglang.benchmark.serving as s
def cpu():
    return sum(x.ru_utime + x.ru_stime for x in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
inner = s.run_benchmark
def run_benchmark(args):
    c0 = cpu()
    try:
        return inner(args)
    finally:
        print("SGLPERF_CPU_S", cpu() - c0)
s.run_benchmark = run_benchmark
sys.argv = ["bench_serving", *sys.argv[1:]]
s.cli_main()
"""


def bench_serving_run(py: str, url: str, c: int, prompts: int, tok: Path, tmp: Path) -> tuple[float, int, float]:
    out = tmp / f"bench-serving-{prompts}.jsonl"
    cmd = [py, "-c", BENCH_SERVING, "--backend", "sglang", "--base-url", url, "--dataset-name", "random-ids",
           "--tokenize-prompt", "--random-input-len", str(ISL), "--random-output-len", str(OSL),
           "--random-range-ratio", "1", "--num-prompts", str(prompts), "--max-concurrency", str(c), "--request-rate",
           "inf", "--tokenizer", str(tok), "--model", "sim", "--ready-check-timeout-sec", "0", "--disable-tqdm",
           "--output-file", str(out)]
    _, wall, stdout = timed(cmd)  # its own count, without the imports, is the one to use
    cpu = float(next(line.split()[1] for line in stdout.splitlines() if line.startswith("SGLPERF_CPU_S")))
    doc = json.loads(out.read_text().splitlines()[-1])
    return cpu, int(doc["total_output_tokens"]), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-python", required=True, help="python of a venv with sglang==0.5.23")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--short-seconds", type=float, default=5)
    ap.add_argument("--long-seconds", type=float, default=40)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the medians are what to read (±2 µs per "
                    "token between rounds on a 2-core VM)")
    ap.add_argument("--time-scale", default="4", help="the simulator's --time-scale: a faster server, more tokens "
                    "per second, so start-up noise (bench_serving imports torch) weighs less in the difference")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sglperf-vs-"))
    tok = word_tokenizer(tmp / "tok")
    srv = launch(LaunchSpec("sim", [sys.executable, "-m", "sglperf.sim", "--preset", "ci", "--random-seed", "1",
                                              "--time-scale", a.time_scale],
                            tmp / "logs", launch_timeout_s=60))
    per: dict[str, list[float]] = {}
    lengths = (a.short_seconds, a.long_seconds)
    print(f"{'client':<26} {'short: CPU s, tokens':>22} {'long: CPU s, tokens':>22} {'marginal µs/token':>18}")
    try:
        for rep in range(a.repeat):  # the clients take turns, so a slow spell of the machine hits each about alike
            runs = {}
            for loop in ("uvloop", "asyncio"):  # uvloop where installed (sglperf[fast]); asyncio's own loop
                runs[f"sglperf bench ({loop})"] = [sglperf_run(srv.url, a.concurrency, s, tmp, loop) for s in lengths]
            sp = runs["sglperf bench (asyncio)"]
            rate = sp[1][1] / sp[1][2]  # tokens/s the server gives: size bench_serving's runs to the same tokens
            n = [max(a.concurrency * 2, int(round(rate * s / OSL))) for s in lengths]
            runs["bench_serving 0.5.23"] = [bench_serving_run(a.sglang_python, srv.url, a.concurrency, k, tok, tmp)
                                            for k in n]
            runs["floor: raw uvloop Protocol"] = [floor_run(srv.url, a.concurrency, s) for s in lengths]
            for name, (short, long_) in runs.items():
                per.setdefault(name, []).append((long_[0] - short[0]) / (long_[1] - short[1]) * 1e6)
                print(f"{name:<26} {short[0]:>10.2f} {short[1]:>11,} {long_[0]:>10.2f} {long_[1]:>11,} "
                      f"{per[name][-1]:>18.1f}   (round {rep + 1})", flush=True)
    finally:
        srv.stop()
    med = {name: statistics.median(v) for name, v in per.items()}
    print(f"\nmedian of {a.repeat} round(s), µs per output token: "
          + "; ".join(f"{name} {m:.1f}" for name, m in med.items()))
    for name in ("sglperf bench (uvloop)", "sglperf bench (asyncio)", "floor: raw uvloop Protocol"):
        ratios = [x / y for x, y in zip(per[name], per["bench_serving 0.5.23"])]
        print(f"{name} / bench_serving CPU per output token: {med[name] / med['bench_serving 0.5.23']:.2f} "
              f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
