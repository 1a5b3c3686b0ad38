"""hf2triton.util.workspace: a step's output is built once per key, reused only while its files are
intact, and half-finished work never looks finished."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hf2triton.errors import ArtifactError
from hf2triton.util.workspace import DONE_FILE, atomic_write_text, cached_step, hash_files, home

KEY = "a1b2c3d4e5f60718293a4b5c6d7e8f90" * 2


class Builder:
    """A build function that writes two files and records each time it really runs."""

    def __init__(self, text: str = "weights v1", fail: BaseException | None = None):
        self.runs: list[Path] = []
        self.text = text
        self.fail = fail

    def __call__(self, out: Path) -> dict:
        self.runs.append(out)
        (out / "model.onnx").write_text(self.text, encoding="utf-8")
        (out / "sub").mkdir()
        (out / "sub" / "tokenizer.json").write_text("{}", encoding="utf-8")
        if self.fail is not None:
            raise self.fail
        return {"answer": 42, "text": self.text}


def leftovers(step_dir: Path) -> list[str]:
    """Temporary directories or files a step left behind."""
    if not step_dir.exists():
        return []
    return sorted(p.name for p in step_dir.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------------------------------------
# Reuse


def test_second_call_with_same_key_reuses_the_output(tmp_path):
    build = Builder()
    first = cached_step(tmp_path, "export", KEY, build)
    second = cached_step(tmp_path, "export", KEY, build)

    assert len(build.runs) == 1  # the work was not redone
    assert first.reused is False
    assert second.reused is True
    assert second.path == first.path == tmp_path / "export" / KEY[:16]
    assert second.result == first.result == {"answer": 42, "text": "weights v1"}
    assert second.files == first.files
    assert set(first.files) == {"model.onnx", "sub/tokenizer.json"}
    assert (first.path / "model.onnx").read_text() == "weights v1"
    assert (first.path / DONE_FILE).is_file()
    assert leftovers(tmp_path / "export") == []


def test_the_marker_records_key_result_and_hashes(tmp_path):
    out = cached_step(tmp_path, "export", KEY, Builder())
    done = json.loads((out.path / DONE_FILE).read_text())
    assert done["key"] == KEY
    assert done["result"] == out.result
    assert done["files"] == hash_files(out.path)


@pytest.mark.parametrize(
    "step_b, key_b, shared",
    [("export", KEY, True), ("quantize", KEY, False), ("export", "f" * 64, False)],
)
def test_reuse_is_per_step_and_key(tmp_path, step_b, key_b, shared):
    build = Builder()
    a = cached_step(tmp_path, "export", KEY, build)
    b = cached_step(tmp_path, step_b, key_b, build)
    assert b.reused is shared
    assert (a.path == b.path) is shared
    assert len(build.runs) == (1 if shared else 2)


def test_a_later_run_in_a_new_process_like_state_reuses(tmp_path):
    # Nothing is kept in memory: a fresh builder still finds the finished directory.
    cached_step(tmp_path, "export", KEY, Builder("first"))
    later = Builder("second")
    out = cached_step(tmp_path, "export", KEY, later)
    assert out.reused is True
    assert later.runs == []
    assert (out.path / "model.onnx").read_text() == "first"


def test_keys_sharing_a_prefix_are_not_confused(tmp_path):
    cached_step(tmp_path, "export", "0" * 16 + "a" * 48, Builder("for key a"))
    other = Builder("for key b")
    out = cached_step(tmp_path, "export", "0" * 16 + "b" * 48, other)
    assert (out.path / "model.onnx").read_text() == "for key b"


# ---------------------------------------------------------------------------------------------
# Failure and tampering


@pytest.mark.parametrize(
    "error", [RuntimeError("export blew up"), KeyboardInterrupt(), ValueError("bad graph")]
)
def test_a_failed_build_leaves_nothing_finished_and_the_next_call_builds_afresh(tmp_path, error):
    failing = Builder(fail=error)
    with pytest.raises(type(error)):
        cached_step(tmp_path, "export", KEY, failing)
    assert len(failing.runs) == 1
    assert not (tmp_path / "export" / KEY[:16]).exists()
    assert not failing.runs[0].exists()  # the half-written temporary directory is gone
    assert leftovers(tmp_path / "export") == []

    good = Builder("good")
    out = cached_step(tmp_path, "export", KEY, good)
    assert out.reused is False
    assert len(good.runs) == 1
    assert (out.path / "model.onnx").read_text() == "good"


def test_an_os_error_in_the_build_becomes_an_artifact_error(tmp_path):
    full = Builder(fail=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(ArtifactError) as info:
        cached_step(tmp_path, "export", KEY, full)
    msg = str(info.value)
    assert "export" in msg
    assert str(tmp_path / "export") in msg
    assert "ran out of disk space" in msg and "free there" in msg  # DiskFullError
    assert not (tmp_path / "export" / KEY[:16]).exists()
    assert leftovers(tmp_path / "export") == []


def test_a_result_that_is_not_json_leaves_nothing_finished(tmp_path):
    with pytest.raises(TypeError):
        cached_step(tmp_path, "export", KEY, lambda out: {"bad": {1, 2}})
    assert not (tmp_path / "export" / KEY[:16]).exists()
    assert leftovers(tmp_path / "export") == []


def _modify(d: Path) -> None:
    (d / "model.onnx").write_text("tampered", encoding="utf-8")


def _delete(d: Path) -> None:
    (d / "sub" / "tokenizer.json").unlink()


def _add(d: Path) -> None:
    (d / "extra.bin").write_bytes(b"\0")


def _drop_marker(d: Path) -> None:
    (d / DONE_FILE).unlink()


def _corrupt_marker(d: Path) -> None:
    (d / DONE_FILE).write_text("{not json", encoding="utf-8")


def _marker_without_files(d: Path) -> None:
    (d / DONE_FILE).write_text(json.dumps({"key": KEY, "result": {}}), encoding="utf-8")


@pytest.mark.parametrize(
    "tamper", [_modify, _delete, _add, _drop_marker, _corrupt_marker, _marker_without_files]
)
def test_a_tampered_or_unfinished_directory_is_rebuilt(tmp_path, tamper):
    build = Builder()
    first = cached_step(tmp_path, "export", KEY, build)
    tamper(first.path)

    again = cached_step(tmp_path, "export", KEY, build)
    assert again.reused is False
    assert len(build.runs) == 2
    assert again.path == first.path
    assert (again.path / "model.onnx").read_text() == "weights v1"
    assert sorted(p.name for p in again.path.iterdir()) == [DONE_FILE, "model.onnx", "sub"]
    assert hash_files(again.path) == first.files
    # ...and the rebuilt directory is reused from then on.
    assert cached_step(tmp_path, "export", KEY, build).reused is True
    assert len(build.runs) == 2
    assert leftovers(tmp_path / "export") == []


READ_ONLY_PROBE = """
import sys
from hf2triton.errors import ArtifactError
from hf2triton.util.workspace import cached_step
try:
    cached_step(sys.argv[1], "export", "k" * 64, lambda out: {})
except ArtifactError as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_read_only_home_gives_an_artifact_error_naming_the_directory(tmp_path):
    root = tmp_path / "home"
    root.mkdir()
    root.chmod(
        stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    )
    tmp_path.chmod(0o755)
    cmd = [sys.executable, "-c", READ_ONLY_PROBE, str(root)]
    if os.geteuid() == 0:
        # Root ignores directory permissions: run the step as an ordinary user instead.
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to drop root for this test"
        for parent in tmp_path.parents:
            if parent != Path("/"):
                parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
        cmd = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert str(root / "export") in proc.stdout
        assert "permissions" in proc.stdout
        assert not (root / "export").exists()
    finally:
        root.chmod(stat.S_IRWXU)


def test_a_home_that_cannot_hold_directories_gives_an_artifact_error(tmp_path):
    # Works as root too: nothing can be created below a regular file.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    root = blocker / "sub"
    build = Builder()
    with pytest.raises(ArtifactError) as info:
        cached_step(root, "export", KEY, build)
    msg = str(info.value)
    assert f"cannot write to {root / 'export'}" in msg
    assert "HF2TRITON_HOME" in msg
    assert build.runs == []


# ---------------------------------------------------------------------------------------------
# atomic_write_text


def test_atomic_write_creates_parents_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a" / "b" / "report.json"
    atomic_write_text(target, "héllo\n")
    assert target.read_text(encoding="utf-8") == "héllo\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]


def test_atomic_write_replaces_existing_content(tmp_path):
    target = tmp_path / "report.json"
    for text in ("one", "two, longer", "3"):
        atomic_write_text(target, text)
        assert target.read_text(encoding="utf-8") == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "report.json"
    atomic_write_text(target, "old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(target, "new \ud800 text")  # a lone surrogate cannot be UTF-8
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_home_follows_hf2triton_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "h"))
    assert home() == (tmp_path / "h").resolve()
    monkeypatch.delenv("HF2TRITON_HOME")
    monkeypatch.chdir(tmp_path)
    assert home() == (tmp_path / ".hf2triton").resolve()


@pytest.fixture()
def full_disk(tmp_path):
    """A 256 KiB tmpfs: a real filesystem that runs out of space."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a small tmpfs to fill: {proc.stderr.strip()}")
        pytest.skip(f"mounting a tmpfs needs root: {proc.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True)


def test_a_full_disk_is_reported_as_such_and_leaves_nothing_finished(full_disk):
    def build(out: Path) -> dict:
        (out / "model.onnx").write_bytes(b"\0" * (1 << 20))  # 1 MiB onto 256 KiB
        return {}

    with pytest.raises(ArtifactError) as info:
        cached_step(full_disk, "quantize", KEY, build)
    message = str(info.value)
    assert "ran out of disk space" in message and "Free space on that disk" in message
    assert str(full_disk / "quantize") in message
    assert leftovers(full_disk / "quantize") == []
    assert not any(
        p.is_dir() and not p.name.startswith(".") for p in (full_disk / "quantize").iterdir()
    )


def test_a_large_file_is_linked_and_a_small_one_copied(tmp_path):
    """The repository step's files: a graph is one file on disk twice named (no second copy);
    code and configuration are copies, so editing the source never changes a rendered one."""
    from hf2triton.util.workspace import LINK_FROM_BYTES, link_or_copy

    big, small = tmp_path / "model.onnx", tmp_path / "model.py"
    big.write_bytes(b"\0" * LINK_FROM_BYTES)
    small.write_text("print('hi')\n")
    link_or_copy(big, tmp_path / "big-linked")
    link_or_copy(small, tmp_path / "small-copied")
    assert (tmp_path / "big-linked").stat().st_ino == big.stat().st_ino
    assert (tmp_path / "small-copied").stat().st_ino != small.stat().st_ino
    assert (tmp_path / "small-copied").read_text() == small.read_text()


def test_a_folder_counts_a_file_linked_twice_once(tmp_path):
    from hf2triton.util.workspace import tree_size

    (tmp_path / "a").write_bytes(b"\0" * 1000)
    (tmp_path / "b").hardlink_to(tmp_path / "a")
    (tmp_path / "c").write_bytes(b"\0" * 10)
    assert tree_size(tmp_path) == 1010
    assert tree_size(tmp_path / "gone") == 0
