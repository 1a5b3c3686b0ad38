"""Faults of a release under way, through the real CLI: two runs of the same release started
together take turns (one version, the second reuses every step; a run that cannot wait stops with
one line naming the other), and an hf2triton home on a disk that fills during the export fails
with one line naming the folder and the space, registers nothing and leaves the serving version
answering."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hf2triton.util.workspace import disk_space, size_text
from tests.conftest import ROOT, new_ports, tiny_spec
from tests.flows.test_faults import HF2TRITON, _cli, _error_line, _fresh_env, _mlflow_versions
from tests.served import embed_remote, serving_versions, triton_client

RELEASE_TIMEOUT_S = 900


def _start(spec: Path, env: dict, log: Path) -> subprocess.Popen:
    """`hf2triton release SPEC` in the background, its stdout and stderr in files (two runs that
    wait on each other must not block on a full pipe)."""
    return subprocess.Popen(
        [HF2TRITON, "release", str(spec)],
        env=env,
        cwd=ROOT,
        stdout=open(log.with_suffix(".out"), "w"),
        stderr=open(log.with_suffix(".err"), "w"),
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, log: Path) -> tuple[int, str, str]:
    try:
        proc.wait(RELEASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise AssertionError(
            f"a release ran past {RELEASE_TIMEOUT_S} s:\n"
            f"{log.with_suffix('.err').read_text()[-6000:]}"
        ) from None
    return (
        proc.returncode,
        log.with_suffix(".out").read_text(),
        log.with_suffix(".err").read_text(),
    )


# --- two runs of one release at once ---------------------------------------------------------


def test_a_held_release_lock_makes_a_second_taker_wait_then_stop_naming_the_holder(hf2triton_home):
    import threading

    from hf2triton.errors import ReleaseBusyError
    from hf2triton.orchestration.locks import release_lock

    with release_lock("tiny") as path:
        with pytest.raises(ReleaseBusyError, match=rf"by pid {os.getpid()} since .*waited 0 s"):
            with release_lock("tiny", wait_s=0.3):
                pass
        with release_lock("other", wait_s=0):  # another release is not held up
            pass
    held, order = threading.Event(), []

    def holder() -> None:
        with release_lock("tiny"):
            held.set()
            time.sleep(1.0)  # the second taker asks while the lock is held
            order.append("holder released")

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    with release_lock("tiny", wait_s=30):
        order.append("second taker works")
    thread.join()
    assert order == ["holder released", "second taker works"]  # it waited its turn
    assert path.read_text() == ""  # no holder named once the lock is free


def test_a_killed_holder_leaves_no_stale_lock(hf2triton_home):
    from hf2triton.orchestration.locks import read_holder, release_lock

    code = (
        "import time; from hf2triton.orchestration.locks import release_lock\n"
        "with release_lock('tiny') as p:\n    print('held', p, flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF2TRITON_HOME": str(hf2triton_home)},
    )
    try:
        line = proc.stdout.readline().split()
        assert line[0] == "held", line
        lock = hf2triton_home / "locks" / "tiny.lock"
        assert (read_holder(lock) or {}).get("pid") == proc.pid, line
    finally:
        proc.kill()
        proc.wait(30)
    with release_lock("tiny", wait_s=0):
        pass


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_lock_wait_is_refused_naming_the_variable(monkeypatch, value):
    from hf2triton.errors import EnvironmentSetupError
    from hf2triton.orchestration.locks import lock_wait_s

    monkeypatch.setenv("HF2TRITON_LOCK_WAIT_S", value)
    with pytest.raises(EnvironmentSetupError, match=rf"HF2TRITON_LOCK_WAIT_S='{value}'"):
        lock_wait_s()
    monkeypatch.setenv("HF2TRITON_LOCK_WAIT_S", "")
    assert lock_wait_s() == 3600


@pytest.mark.e2e
def test_two_runs_of_a_release_at_once_take_turns_and_register_one_version(
    tiny_bert, tmp_path, monkeypatch
):
    from hf2triton.orchestration.locks import release_lock

    spec = tiny_spec(
        tmp_path / "spec.yaml",
        tiny_bert,
        new_ports(),
        name="tiny-twice",
        registry__model_name="tiny-twice",
    )
    home = tmp_path / "home"
    env = _fresh_env(home)
    logs = [tmp_path / "run-a", tmp_path / "run-b"]
    procs = [_start(spec, env, log) for log in logs]  # a schedule and a trigger at once
    try:
        runs = [_finish(proc, log) for proc, log in zip(procs, logs)]
        for code, _, err in runs:
            assert code == 0, err[-3000:]
        waited = [i for i, (_, _, err) in enumerate(runs) if "waiting for the release run" in err]
        assert len(waited) == 1, "exactly one run should have waited for the other"
        second, first = waited[0], 1 - waited[0]
        err = runs[second][2]
        assert f"waiting for the release run by pid {procs[first].pid} " in err
        assert "flow run '" in err and "HF2TRITON_LOCK_WAIT_S" in err
        assert "waiting for the release run" not in runs[first][2]
        summaries = [json.loads(out) for _, out, _ in runs]
        assert [s["mlflow"]["version"] for s in summaries] == ["1", "1"]
        assert _mlflow_versions(home) == [("tiny-twice", "1")]
        # No interleaving: the second began its steps after the first had finished all of its.
        assert summaries[first]["reused_steps"] == []
        assert set(summaries[second]["reused_steps"]) >= {
            "export",
            "quantize",
            "validate",
            "build-repository",
            "register",
            "deploy",
        }

        # A run that may not wait (long) stops with one line naming the run that holds the lock.
        monkeypatch.setenv("HF2TRITON_HOME", str(home))
        with release_lock("tiny-twice", wait_s=0):
            busy = _cli(["release", str(spec)], {**env, "HF2TRITON_LOCK_WAIT_S": "1"})
        assert busy.returncode == 1, busy.stderr[-3000:]
        line = _error_line(busy)
        assert "[RELEASE_BUSY]" in line and f"pid {os.getpid()} " in line, line
        assert "HF2TRITON_LOCK_WAIT_S" in line and "waited 1 s" in line
        assert "Task run '" not in busy.stderr  # no step ran
        assert _mlflow_versions(home) == [("tiny-twice", "1")]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        _cli(["server", "stop"], env)


# --- the hf2triton home on a disk that fills -------------------------------------------------

TMPFS_MIB = 64  # a tiny release's home is about 7 MiB here (its Prefect home lies elsewhere)
LEFT_FREE = 1 << 20  # what the ballast leaves: room for the small files a release writes first
BIG_VOCAB = 30_000  # rows of the bigger model's embedding: about 3.7 MiB of fp32 weights


def _mount_tmpfs(path: Path, mib: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"cannot mount a {mib} MiB tmpfs on {path} for this test: it needs root (or "
            f"CAP_SYS_ADMIN). mount said: {(proc.stderr or proc.stdout).strip()}",
            pytrace=False,
        )


def _unmount(path: Path) -> None:
    for _ in range(20):  # the stopped Triton may hold its log a moment longer
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_step_that_fills_the_disk_says_where_and_how_much_and_leaves_nothing(hf2triton_home):
    from hf2triton.errors import DiskFullError
    from hf2triton.util.workspace import SpaceEstimate, cached_step

    root = hf2triton_home / "work" / "tiny"
    _mount_tmpfs(root, 1)
    try:

        def build(out: Path) -> dict:
            (out / "small.txt").write_text("fits")
            (out / "model.onnx").write_bytes(b"\0" * (2 << 20))
            return {}

        with pytest.raises(DiskFullError) as failed:
            cached_step(
                root,
                "export",
                "k" * 64,
                build,
                needs=lambda: SpaceEstimate(3 << 20, "what the test says"),
            )
        text = str(failed.value)
        assert f"the export step ran out of disk space writing {root / 'export'}: " in text
        assert "it needs about 3.0 MiB (an estimate: what the test says); " in text
        assert re.search(
            r"; 1\.0 MiB are free there \(of 1\.0 MiB\); [\d.]+ KiB had been written "
            r"when the disk filled \(removed again\)\. ",
            text,
        ), text
        assert f"set HF2TRITON_HOME to a folder on a bigger disk (now {hf2triton_home})" in text
        assert "\n" not in text
        assert list((root / "export").iterdir()) == []  # nothing half-written left
        with pytest.raises(DiskFullError, match=r"it needs more than the [\d.]+ KiB it had"):
            cached_step(root, "export", "k" * 64, build)  # no estimate: what it wrote
    finally:
        _unmount(root)


@pytest.mark.parametrize(
    "dtype, task, factor, basis",
    [
        (None, "feature-extraction", 1, "the source model's weights as fp32 ONNX"),
        ("bfloat16", "feature-extraction", 2, "the source model's bfloat16 weights as fp32 ONNX"),
        ("float32", "text2text-generation-with-past", 2, "2 times for its text2text-generation"),
    ],
)
def test_the_export_estimate_is_the_weights_as_fp32_once_per_graph(
    tmp_path, dtype, task, factor, basis
):
    from types import SimpleNamespace

    from hf2triton.release.export import export_space

    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 1000)  # the same weights again
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": dtype}))
    found = export_space(SimpleNamespace(onnx_task=task), str(tmp_path))
    assert found.size == 1000 * factor and basis in found.basis


def _bigger_tiny_bert(tiny_bert: Path, out: Path) -> Path:
    """The tiny BERT's tokenizer with new weights whose embedding has BIG_VOCAB rows (the rows
    past the tokenizer's are never looked up): a larger export of the same release."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    shutil.copytree(tiny_bert, out)
    config = BertConfig.from_pretrained(out)
    config.vocab_size = BIG_VOCAB
    torch.manual_seed(7)
    BertModel(config).eval().save_pretrained(out)
    return out


def _fill(home: Path, left: int) -> None:
    """Take all but `left` bytes of the file system under `home` with one ballast file."""
    free, _ = disk_space(home)
    assert free > left, f"the tmpfs is already fuller than the test wants: {free} bytes free"
    fd = os.open(home / "ballast", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, free - left)
    finally:
        os.close(fd)


@pytest.mark.e2e
def test_home_on_a_disk_that_fills_during_export_fails_in_one_line_and_the_old_version_serves(
    tiny_bert, tmp_path
):
    home = tmp_path / "home"
    _mount_tmpfs(home, TMPFS_MIB)
    env = _fresh_env(home)
    try:
        ports = new_ports()
        spec = tiny_spec(
            tmp_path / "spec.yaml",
            tiny_bert,
            ports,
            name="tiny-full",
            registry__model_name="tiny-full",
        )
        first = _cli(["release", str(spec)], env)
        assert first.returncode == 0, first.stderr[-3000:]
        client = triton_client(f"127.0.0.1:{ports['http_port']}")
        grpc = f"127.0.0.1:{ports['grpc_port']}"
        assert serving_versions(client, "tiny-full") == ["1"]
        before, _ = embed_remote("grpc", grpc, "tiny-full", "", ["the quick brown fox"])

        big = _bigger_tiny_bert(tiny_bert, tmp_path / "big-tiny-bert")
        weights = (big / "model.safetensors").stat().st_size
        assert weights > 3 * LEFT_FREE  # an export that cannot fit in what is left
        _fill(home, LEFT_FREE)
        spec = tiny_spec(
            tmp_path / "spec.yaml", big, ports, name="tiny-full", registry__model_name="tiny-full"
        )
        full = _cli(["release", str(spec)], env)

        assert full.returncode == 1, full.stderr[-3000:]
        line = _error_line(full)
        export_dir = home / "work" / "tiny-full" / "export"
        assert "[DISK_FULL]" in line and f"writing {export_dir}:" in line, line
        assert f"it needs about {size_text(weights)} (an estimate" in line, line
        free = re.search(r"; ([\d.]+ [KM]iB) are free there \(of ([\d.]+) MiB\)", line)
        assert free and float(free.group(2)) == pytest.approx(TMPFS_MIB), line
        assert "HF2TRITON_HOME" in line and "[UNEXPECTED]" not in line
        # Nothing half-written is left, and the space it took is free again.
        assert not [p for p in export_dir.iterdir() if p.name.endswith(".tmp")]
        assert disk_space(home)[0] >= LEFT_FREE - (64 << 10)
        assert "Task run 'register" not in full.stderr and "Task run 'deploy" not in full.stderr
        assert _mlflow_versions(home) == [("tiny-full", "1")]
        assert serving_versions(client, "tiny-full") == ["1"]
        after, _ = embed_remote("grpc", grpc, "tiny-full", "", ["the quick brown fox"])
        assert np.allclose(after, before)
    finally:
        _cli(["server", "stop"], env)
        _unmount(home)
