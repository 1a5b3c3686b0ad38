"""What a release costs, by model size: random models of real models' shapes released as a new
user does (`hf2triton release SPEC`, in a fresh hf2triton home), with the shipped spec's settings
(releases/smollm2-135m-instruct.yaml, its source replaced, max_context 512, max_new_tokens 96, as
issue 46 measured). For each: the wall time, each step's, the peak resident memory of every
process the release starts together (sampled), what the work folder keeps and what the tidy step
removed, the MLflow artifacts, and what shipped. With `--ab` each shape is released twice in the
same run: pruned (the default search) and with `quantization.prune: false` (every candidate built
and timed, as before): the ratios hold on one machine, one run.

    .venv/bin/python benchmarks/generation_release.py [--shape NAME ...] [--ab]
        [--objective throughput|latency] [--model DIR] [--memory-limit-gb N]

Memory is measured three ways: the peak of the summed resident memory (RSS, which counts a
memory-mapped weights file once per mapping and per process, though the kernel holds it once and
may drop it), the peak of the summed anonymous memory (what the processes allocated, which the
kernel cannot drop without swap), and, with `--memory-limit-gb N`, whether the release completes
in a memory cgroup of N GB (v1's memory controller, as root; a machine of N GB, page cache
included): the cgroup's peak and its OOM kills are recorded.

Shapes (random weights, the real model's config; a byte-level BPE tokenizer trained on the
shipped King James text, the vocabulary rows it does not use zeroed so greedy text stays in it):
qwen2-25m (tests/tiny_models.build_qwen2), smollm2-135m, smollm2-360m, qwen2.5-0.5b,
smollm2-1.7b; and an embedder of multilingual-e5-large's shape (XLM-RoBERTa-large, 560M, with
a WordPiece tokenizer trained on the same text), released with the settings of
releases/multilingual-e5-large.yaml on the 350 validation sentences. Models are built once into
.cache/bench-models/. Writes benchmarks/results/generation-release-<UTC time>.json and prints a
table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = ROOT / ".venv" / "bin"
CACHE = ROOT / ".cache" / "bench-models"

# The real models' shapes (their config.json), Llama (SmolLM2) and Qwen2 (Qwen2.5).
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": (
        "llama",
        dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
             num_attention_heads=9, num_key_value_heads=3, vocab_size=49152),
    ),
    "smollm2-360m": (
        "llama",
        dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
             num_attention_heads=15, num_key_value_heads=5, vocab_size=49152),
    ),
    "smollm2-1.7b": (
        "llama",
        dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
             num_attention_heads=32, num_key_value_heads=32, vocab_size=49152),
    ),
    "qwen2.5-0.5b": (
        "qwen2",
        dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
             num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    ),
    # An embedder: intfloat/multilingual-e5-large's XLM-RoBERTa-large (560M parameters, 250,002
    # tokens of vocabulary), released with releases/multilingual-e5-large.yaml's settings.
    "multilingual-e5-large": (
        "xlm-roberta",
        dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
             num_attention_heads=16, vocab_size=250002, max_position_embeddings=514,
             type_vocab_size=1, layer_norm_eps=1e-5),
    ),
}  # fmt: skip
# The shipped spec each architecture is released with (its source, name and ports replaced).
SPECS = {
    "llama": "smollm2-135m-instruct.yaml",
    "qwen2": "smollm2-135m-instruct.yaml",
    "xlm-roberta": "multilingual-e5-large.yaml",
}


def build_shape(name: str) -> Path:
    """The random model of `name`'s shape, built once into .cache/bench-models/<name>."""
    out = CACHE / name
    if (out / "config.json").is_file() and list(out.glob("*.safetensors")):
        return out
    if name == "qwen2-25m":
        from tests.tiny_models import build_qwen2

        return build_qwen2(out)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from tests.tiny_models import _save_causal, kjv_tokenizer

    arch, shape = SHAPES[name]
    if arch == "xlm-roberta":
        return build_embedder(out, shape)
    tok = kjv_tokenizer(8192)
    eos = tok.token_to_id("<|endoftext|>")
    config_cls, model_cls = (
        (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    )
    config = config_cls(
        **shape,
        max_position_embeddings=2048,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        tie_word_embeddings=True,
        initializer_range=0.05,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = model_cls(config)
    with torch.no_grad():  # ids the tokenizer lacks never win greedy decoding
        model.get_output_embeddings().weight[tok.get_vocab_size() :] = 0.0
    out.mkdir(parents=True, exist_ok=True)
    return _save_causal(out, model, tok, 2048, eos_boost=0.0)


def build_embedder(out: Path, shape: dict[str, Any]) -> Path:
    """A sentence-transformers embedder of XLM-RoBERTa's `shape`, random, as e5 is laid out
    (mean pooling, normalised, 512 tokens), with a WordPiece tokenizer of 8,192 trained on the
    shipped King James text (the vocabulary rows it does not use stay unused)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    text = ROOT / "releases" / "data" / "kjv-pentateuch.txt"
    lines = [ln for ln in text.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # XLM-R's ids 0-3
    tok.train_from_iterator(
        lines, trainers.WordPieceTrainer(vocab_size=8192, special_tokens=specials)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_max_length=512,
    ).save_pretrained(out)
    torch.manual_seed(0)
    config = XLMRobertaConfig(**shape, bos_token_id=0, pad_token_id=1, eos_token_id=2)
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(out)
    st = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": st + "Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": shape["hidden_size"], "pooling_mode_mean_tokens": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return out


def spec_for(model_dir: Path, work: Path, name: str, prune: bool, objective: str) -> Path:
    """The shipped spec of the shape's kind (SPECS) with the model, lengths and free ports of
    this run."""
    import yaml

    from hf2triton.util.net import free_port

    arch = SHAPES[name][0] if name in SHAPES else "llama"
    spec = yaml.safe_load((ROOT / "releases" / SPECS[arch]).read_text())
    spec["source"] = {"path": str(model_dir), "model_id": f"bench/{name}"}
    spec["name"] = spec["registry"]["model_name"] = f"bench-{name.replace('.', '-')}"
    if "text_generation" in spec:
        spec["text_generation"].update(max_new_tokens=96, max_context=512)
        prompts = ROOT / "releases" / "data" / "generation-prompts.txt"
    else:
        prompts = ROOT / "releases" / "data" / "embedding-validation.txt"
    spec["validation"]["sentences"] = str(prompts)
    spec["quantization"]["prune"] = prune
    spec["runtime"] = {**spec.get("runtime", {}), "objective": objective}
    spec["deploy"].update(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        openai={"port": free_port()},
    )
    spec.pop("watch", None)
    path = work / f"spec-{name}-{'pruned' if prune else 'every'}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class PeakRss:
    """The peak of the summed resident memory of a process and every process it started
    (Triton and its Python stubs included), sampled every half second."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self.peak_anon = 0  # the peak of the summed anonymous resident memory
        self.peak_at = time.time()  # when the peak was seen
        self.peak_parts: dict[str, int] = {}  # MB per process (by its command) at the peak
        self.trace: list[tuple[float, int]] = []  # (time, MB) every few seconds
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
                total, anon, parts = 0, 0, dict[str, int]()
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                        anon += anonymous(p.pid)
                        name = " ".join(p.cmdline()[:3])[-60:] or p.name()
                    except (psutil.Error, OSError):
                        continue
                    total += rss
                    key = f"{p.pid} {name}"
                    parts[key] = parts.get(key, 0) + rss // 2**20
                self.peak_anon = max(self.peak_anon, anon)
                if total > self.peak:
                    self.peak, self.peak_at, self.peak_parts = total, time.time(), parts
                if not self.trace or time.time() - self.trace[-1][0] >= 5:
                    self.trace.append((round(time.time(), 1), total // 2**20))
            except psutil.Error:
                pass
            self._stop.wait(0.5)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def anonymous(pid: int) -> int:
    """A process's anonymous resident bytes (RssAnon in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class MemoryCgroup:
    """A cgroup v1 memory group limited to `gb` GB (no swap here), for one release and every
    process it starts: its peak usage and its OOM kills."""

    ROOT = Path("/sys/fs/cgroup/memory")

    def __init__(self, gb: float) -> None:
        self.path = self.ROOT / f"hf2triton-bench-{os.getpid()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(int(gb * 2**30)))
        self.gb = gb

    def enter(self) -> None:
        """Move the calling process in (a Popen's preexec_fn: the release and its children)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def figures(self) -> dict[str, Any]:
        oom = dict(
            line.split() for line in (self.path / "memory.oom_control").read_text().splitlines()
        )
        return {
            "limit_gb": self.gb,
            "peak_mb": int((self.path / "memory.max_usage_in_bytes").read_text()) // 2**20,
            "oom_kills": int(oom.get("oom_kill", 0)),
            "failcnt": int((self.path / "memory.failcnt").read_text()),
        }

    def remove(self) -> None:
        """Move what is left back out and remove the group (a process still exiting keeps it
        busy a moment: tried for 30 s, then left with a warning, never raising)."""
        for _ in range(60):
            try:
                for pid in (self.path / "cgroup.procs").read_text().split():
                    (self.ROOT / "cgroup.procs").write_text(pid)
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.5)
        print(f"warning: {self.path} was left behind (rmdir it later)", file=sys.stderr)


STEP_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d+) .*Task run '([^']+)' - Finished in state")


def step_ends(stderr: str) -> list[tuple[str, float]]:
    """Each finished task run's step name and its end, in seconds of the (local) day."""
    ends = []
    for line in stderr.splitlines():
        m = STEP_LINE.match(line)
        if m:
            h, mi, s, frac, run = m.groups()
            t = int(h) * 3600 + int(mi) * 60 + int(s) + float(f"0.{frac}")
            ends.append((re.sub(r"-[0-9a-f]{3,}$", "", run).split(" ")[0], t))
    return ends


def step_seconds(ends: list[tuple[str, float]]) -> dict[str, float]:
    """Each step's wall seconds, from the ends of consecutive finished task runs."""
    out: dict[str, float] = {}
    for (_, last), (step, t) in zip(ends, ends[1:]):
        out[step] = round(out.get(step, 0.0) + t - last, 1)
    return out


def step_at(ends: list[tuple[str, float]], when: float) -> str:
    """The step running at `when` (epoch seconds): the first whose end is not before it."""
    local = time.localtime(when)
    t = local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec + when % 1
    return next((step for step, end in ends if end >= t), "after the last step")


def release(spec: Path, home: Path, limit_gb: float | None = None) -> dict[str, Any]:
    """One `hf2triton release` in a fresh home (in a memory cgroup of `limit_gb` GB when
    given): its summary, wall time, steps, peak memory and disk; the Triton it started is
    stopped after."""
    env = {**os.environ, "HF2TRITON_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cgroup = MemoryCgroup(limit_gb) if limit_gb else None
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "hf2triton"), "release", str(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=cgroup.enter if cgroup else None,
    )
    peak = PeakRss(proc.pid)
    out, err = proc.communicate()
    record: dict[str, Any] = {
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(peak.stop() / 2**20),
        "peak_anon_mb": round(peak.peak_anon / 2**20),
    }
    if cgroup:
        record["cgroup"] = cgroup.figures()
    (home.parent / f"{spec.stem}.log").write_text(err)
    try:
        if proc.returncode:
            raise SystemExit(f"the release failed ({proc.returncode}; {record}):\n{err[-4000:]}")
        summary = json.loads(out.strip().splitlines()[-1])
        ends = step_ends(err)
        record.update(
            peak_during=step_at(ends, peak.peak_at),
            peak_parts_mb=peak.peak_parts,
            rss_trace_mb=[(step_at(ends, t), mb) for t, mb in peak.trace[::6]],
            steps=step_seconds(ends),
            variant=summary["variant"],
            metrics=summary["metrics"],
            disk_mb=disk(home, summary),
        )
        record["log"] = [ln for ln in err.splitlines() if "validate:" in ln or "tidy:" in ln]
        return record
    finally:
        subprocess.run([str(BIN / "hf2triton"), "server", "stop"], env=env, capture_output=True)
        if cgroup:
            cgroup.remove()


def disk(home: Path, summary: dict[str, Any]) -> dict[str, float]:
    """MB the release keeps (work folder, MLflow artifacts, Triton's repository), what ships
    (the served version folder) and what tidy removed."""
    from hf2triton.util.workspace import tree_size

    mb = 2**20
    served = [p for p in (home / "triton" / "models").glob("*/*") if p.is_dir()]
    return {
        "work": round(tree_size(home / "work") / mb),
        "mlflow_artifacts": round(sum(tree_size(p) for p in home.rglob("mlartifacts")) / mb),
        "triton_models": round(tree_size(home / "triton" / "models") / mb),
        "ships": round(max((tree_size(p) for p in served), default=0) / mb),
        "tidied": round(summary.get("work", {}).get("removed_bytes", 0) / mb),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["qwen2-25m"])
    parser.add_argument("--model", type=Path, help="a causal LM directory instead of a shape")
    parser.add_argument("--ab", action="store_true", help="also release with prune: false")
    parser.add_argument("--objective", default="throughput", choices=("throughput", "latency"))
    parser.add_argument(
        "--memory-limit-gb", type=float, help="release in a memory cgroup of this many GB"
    )
    args = parser.parse_args()
    from hf2triton.util.cpu import cpu_features

    work = Path(tempfile.mkdtemp(prefix="generation-release-"))
    rows = []
    for name in ["model"] if args.model else args.shape:
        model_dir = args.model or build_shape(name)
        fp32_mb = round(sum(p.stat().st_size for p in model_dir.glob("*.safetensors")) / 2**20)
        for prune in (True, False) if args.ab else (True,):
            spec = spec_for(model_dir, work, name, prune, args.objective)
            result = release(spec, work / f"home-{name}-{prune}", args.memory_limit_gb)
            rows.append({"shape": name, "fp32_mb": fp32_mb, "prune": prune, **result})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "log"}), flush=True)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    record = {
        "when": stamp,
        "commit": commit,
        "machine": platform.processor(),
        "cpu": cpu_features(),
        "objective": args.objective,
        "runs": rows,
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-release-{stamp}.json").write_text(json.dumps(record, indent=1))
    print(table(rows))


def table(rows: list[dict[str, Any]]) -> str:
    """The runs as a Markdown table."""
    head = (
        "| shape | fp32 MB | search | s | peak RSS MB | peak anon MB | cgroup peak MB (OOM "
        "kills) | work MB | MLflow MB | ships MB | tidied MB | shipped |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"| {r['shape']} | {r['fp32_mb']} | {'pruned' if r['prune'] else 'every'} | "
        f"{r['seconds']} | {r['peak_rss_mb']} | {r['peak_anon_mb']} | "
        + (
            f"{r['cgroup']['peak_mb']} of {r['cgroup']['limit_gb']:g} GB "
            f"({r['cgroup']['oom_kills']}) | "
            if "cgroup" in r
            else "- | "
        )
        + f"{r['disk_mb']['work']} | "
        f"{r['disk_mb']['mlflow_artifacts']} | {r['disk_mb']['ships']} | "
        f"{r['disk_mb']['tidied']} | {r['variant']} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


if __name__ == "__main__":
    main()
