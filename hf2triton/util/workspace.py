"""Where hf2triton keeps its work, and how it writes artifacts so half-finished work never passes
for finished work: build in a temporary directory, record content hashes, rename into place.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from hf2triton.errors import ArtifactError, DiskFullError, EnvironmentSetupError

DONE_FILE = "hf2triton-done.json"


def _checkout() -> Path | None:
    """The repository hf2triton runs from (a clone, installed editable), or None for an
    installed wheel: its release specs, prefect.yaml and environments live there."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "releases").is_dir() else None


CHECKOUT = _checkout()
# Where project files are looked for: the checkout, or for an installed wheel the current
# directory (a project of the user's own with releases/ and prefect.yaml).
PROJECT_ROOT = CHECKOUT or Path.cwd()


def resource_dir(name: str) -> Path:
    """A data folder shipped with hf2triton (`model_repository`, `infra`), read through
    importlib.resources: the repository's own folder in a checkout, the copy inside the
    installed package otherwise."""
    import importlib.resources

    found = importlib.resources.files(f"hf2triton.{name}")
    if not isinstance(found, Path):  # a zipped install: Triton and Docker need real files
        raise ArtifactError(
            f"hf2triton.{name} is not on the file system ({found}): install "
            "hf2triton as a plain (unzipped) package"
        )
    return found


def home() -> Path:
    """The working directory: $HF2TRITON_HOME, else `.hf2triton` in the current directory."""
    return Path(os.environ.get("HF2TRITON_HOME") or Path.cwd() / ".hf2triton").resolve()


def work_dir(release: str) -> str:
    """Where a release's step outputs live: <home>/work/<release>."""
    return str(home() / "work" / release)


def ensure_home(*subdirs: str) -> Path:
    """Create the hf2triton home (and the named folders in it) with every missing parent, and
    check that it can be written; raise EnvironmentSetupError naming the path otherwise.

    Libraries handed a folder in the home (Prefect's PREFECT_HOME, MLflow's SQLite store) create
    at most its last part, and fail minutes later and far from the cause when they cannot.
    """
    root = home()
    where = "HF2TRITON_HOME" if os.environ.get("HF2TRITON_HOME") else "the working directory"
    fix = (
        "Set HF2TRITON_HOME to a folder you can write (e.g. HF2TRITON_HOME=$HOME/.hf2triton), "
        "or run from a writable directory"
    )
    for path in (root, *(root / s for s in subdirs)):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocked = next(
                (p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None
            )
            why = f"{blocked} is a file, not a folder" if blocked else exc.strerror or str(exc)
            raise EnvironmentSetupError(
                f"cannot create the hf2triton home {path} (from {where}): {why}. {fix}."
            ) from None
    try:
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise EnvironmentSetupError(
            f"cannot write to the hf2triton home {root} (from {where}): {exc.strerror or exc}. "
            f"{fix}."
        ) from None
    return root


def templates_dir() -> Path:
    return resource_dir("model_repository")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_module(module: ModuleType) -> str:
    """sha256 of a module's source file (every module of this package has one)."""
    assert module.__file__ is not None, f"{module.__name__} has no source file"
    return sha256_file(module.__file__)


def hash_files(root: str | Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """sha256 of each file below `root` (or of the named ones), keyed by relative POSIX path."""
    root = Path(root)
    if names is None:
        # __pycache__ is what Triton's Python backend writes beside model.py, not content.
        paths = sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and p.name != DONE_FILE and "__pycache__" not in p.parts
        )
    else:
        paths = [root / n for n in sorted(names)]
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in paths}


def hash_mismatch(got: dict[str, str] | None, want: dict[str, str]) -> list[str]:
    """The files whose sha256 in `got` is not `want`'s (missing or extra on either side), sorted:
    what every copy of a release's files is checked with before it is deployed, built or
    rendered."""
    got = got or {}
    return sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))


def digest(obj: Any) -> str:
    """A stable sha256 of a JSON-able value."""
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


def source_digest(*modules: ModuleType) -> str:
    """Hash of the source files of the given modules, so a code change invalidates reuse."""
    return digest([sha256_module(m) for m in modules])


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class StepOutput:
    """A finished step directory: its path, what the step returned, and whether it was reused."""

    path: Path
    result: dict[str, Any]
    files: dict[str, str]
    reused: bool


def _read_done(final: Path, key: str) -> StepOutput | None:
    marker = final / DONE_FILE
    if not marker.is_file():
        return None
    try:
        done = json.loads(marker.read_text(encoding="utf-8"))
        if done["key"] != key or hash_files(final) != done["files"]:
            return None
    except (OSError, ValueError, KeyError):
        return None
    return StepOutput(final, done["result"], done["files"], reused=True)


class SpaceEstimate(NamedTuple):
    """About how many bytes a step writes, and what the estimate rests on (for its message)."""

    size: int  # bytes
    basis: str  # "the source model's weights as fp32 ONNX"


# The checkpoint dtypes whose weights are twice their size as fp32.
HALF_DTYPES = {"float16", "bfloat16"}


def fp32_weights(model_dir: str | Path) -> SpaceEstimate:
    """About what the weights of the Hugging Face model in `model_dir` weigh as fp32: its
    safetensors (else its .bin/.pt files), twice over where config.json says half precision."""
    root = Path(model_dir)
    weights = [p for p in root.glob("*.safetensors") if p.is_file()] or [
        p for pattern in ("*.bin", "*.pt", "*.pth") for p in root.glob(pattern) if p.is_file()
    ]
    size = sum(p.stat().st_size for p in weights)
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    except (OSError, ValueError, AttributeError):
        dtype = "float32"
    if dtype in HALF_DTYPES:
        return SpaceEstimate(size * 2, f"the source model's {dtype} weights as fp32")
    return SpaceEstimate(size, "the source model's weights as fp32")


# A full disk, or a full quota: what no retry fixes until someone frees space.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, says the disk (or quota) is full."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def size_text(n: float) -> str:
    """A byte count as people read it: '512 B', '3.9 MiB', '1.2 GiB'."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# Files from this size up are linked, not copied (graphs, weights); smaller ones (code,
# configuration) are copied, so that editing a source file never changes a rendered one.
LINK_FROM_BYTES = 1 << 20


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """`dst` as a hard link to `src` when it is large (no second copy of a graph on disk),
    else, or where the file system cannot link (another device), a copy."""
    if os.path.getsize(src) >= LINK_FROM_BYTES:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


def tree_size(path: str | Path) -> int:
    """Bytes of the files below `path` (0 when it is gone), a file linked twice once: what
    the folder takes on disk."""
    total, seen = 0, set()
    for p in Path(path).rglob("*"):
        try:
            st = p.stat()
        except OSError:
            continue
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def disk_space(path: str | Path) -> tuple[int, int]:
    """(free, total) bytes of the file system holding `path` (or its nearest existing parent)."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def disk_full_error(
    step: str, folder: Path, written: int, needs: Callable[[], SpaceEstimate] | None
) -> DiskFullError:
    """The one-line error of a step that filled the disk under `folder`, after what it wrote
    (`written` bytes) was removed: the folder, what is free there, and what the step needs."""
    try:
        free, total = disk_space(folder)
        room = f"{size_text(free)} are free there (of {size_text(total)})"
    except OSError:
        room = "the free space there is unknown"
    estimate = None
    if needs is not None:
        try:
            estimate = needs()
        except Exception:  # noqa: BLE001 - the message goes without the estimate
            estimate = None
    wrote = f"{size_text(written)} had been written when the disk filled (removed again)"
    if estimate is not None and estimate.size > written:
        need = (
            f"it needs about {size_text(estimate.size)} (an estimate: {estimate.basis}); "
            f"{room}; {wrote}"
        )
    else:
        need = (
            f"it needs more than the {size_text(written)} it had written when the disk "
            f"filled (removed again); {room}"
        )
    elsewhere = (
        f", or set HF2TRITON_HOME to a folder on a bigger disk (now {home()})"
        if Path(folder).resolve().is_relative_to(home())
        else ""
    )
    return DiskFullError(
        f"the {step} step ran out of disk space writing {folder}: {need}. Free space on that "
        f"disk{elsewhere}, then run again: finished steps are reused"
    )


def cached_step(
    root: str | Path,
    step: str,
    key: str,
    build: Callable[[Path], dict[str, Any]],
    needs: Callable[[], SpaceEstimate] | None = None,
) -> StepOutput:
    """Run `build(tmp_dir)` once per `key`; reuse the finished directory when hashes still match.

    `build` writes its files into the directory it is given and returns a JSON-able result. The
    directory is renamed into place only after the marker holding every file's sha256 is written,
    so an interrupted step leaves nothing that looks finished; a failed one leaves nothing at
    all. A full disk raises DiskFullError naming the folder, the space free there and what the
    step needs (`needs()`, an estimate, when the step can tell).
    """
    final = Path(root) / step / key[:16]
    found = _read_done(final, key)
    if found is not None:
        return found
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error(step, final.parent, 0, needs) from exc
        raise ArtifactError(
            f"cannot write to {final.parent}: {exc.strerror or exc}. Free disk space or fix "
            "permissions of the hf2triton home (HF2TRITON_HOME)."
        ) from exc
    try:
        result = build(tmp)
        files = hash_files(tmp)
        atomic_write_text(
            tmp / DONE_FILE, json.dumps({"key": key, "result": result, "files": files}, indent=1)
        )
        if final.exists():  # a stale, unfinished or tampered copy: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException as exc:
        # Whatever it wrote goes, so that a full disk is freed again for the run after.
        full = is_disk_full(exc) and not isinstance(exc, DiskFullError)
        written = tree_size(tmp) if full else 0
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise disk_full_error(step, final.parent, written, needs) from exc
        if isinstance(exc, OSError):
            raise ArtifactError(
                f"writing the {step} step's output under {final.parent} failed: "
                f"{exc.strerror or exc}. Free disk space or fix permissions and run again."
            ) from exc
        raise
    return StepOutput(final, result, files, reused=False)


# user[:password]@ after a URI's scheme, wherever it stands in a text.
URI_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#'\"]+@")


def redact_uri(uri: str) -> str:
    """A registry URI without any user:password in it (a URI Python cannot parse loses
    whatever stands between its scheme and an @)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
        if not (parts.username or parts.password):
            return uri  # as given (urlunsplit would write sqlite:///x as sqlite:/x)
        return urlunsplit(
            parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else ""))
        )
    except ValueError:  # an invalid IPv6 netloc, a port that is no number
        return redact_text(uri)


def has_login(uri: str) -> bool:
    """Whether `uri` carries a user or password (however Python parses it, or cannot)."""
    return bool(URI_CREDENTIALS.search(uri)) or redact_uri(uri) != uri


def redact_text(text: str) -> str:
    """`text` with the user:password of every URI in it taken out."""
    return URI_CREDENTIALS.sub(r"\g<scheme>", text)
