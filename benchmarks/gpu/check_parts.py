"""The GPU check's parts (pack.py's tar, split): each received part checked against the manifest
and moved aside, then all of them joined in the manifest's order and unpacked, every sha256
checked on the way."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path
from typing import IO, Any

from gpu.check_env import probe
from gpu.check_kit import Refused, sha256_file


def read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise Refused(f"no manifest at {path}: carry benchmarks/gpu/pack/manifest.json with a part")
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


def verify_part(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's entry of the part at `path`, once its size and sha256 match it."""
    entry = next((p for p in manifest["parts"] if p["name"] == path.name), None)
    if entry is None:
        raise Refused(
            f"{path.name} is not a part of this pack (its parts: {', '.join(manifest['join'])}): "
            "is the manifest from another pack?"
        )
    if not path.is_file():
        raise Refused(f"{path.name} is missing from {path.parent}: carry it again")
    size, digest = path.stat().st_size, sha256_file(path)
    if size != entry["bytes"] or digest != entry["sha256"]:
        raise Refused(
            f"{path.name}: sha256 {digest[:16]}... ({size} bytes) does not match the manifest's "
            f"{entry['sha256'][:16]}... ({entry['bytes']} bytes): the part was damaged or is "
            "from another pack; carry it again"
        )
    return entry


def receive(parts: list[Path], into: Path, manifest_path: Path | None) -> dict[str, Any]:
    """Check each part against the manifest and move it into `into` (files outside the working
    tree stay while the machine is warm), with the manifest; say which parts are still to come."""
    manifest_path = manifest_path or parts[0].parent / "manifest.json"
    manifest = read_manifest(manifest_path)
    into.mkdir(parents=True, exist_ok=True)
    held = into / "manifest.json"
    if held.is_file() and read_manifest(held)["bundle"]["sha256"] != manifest["bundle"]["sha256"]:
        for stale in into.glob("part-*"):  # an earlier pack's parts
            stale.unlink()
    if manifest_path.resolve() != held.resolve():
        shutil.copyfile(manifest_path, held)
    for part in parts:
        verify_part(part, manifest)
        if part.resolve() != (into / part.name).resolve():
            shutil.move(str(part), into / part.name)
    here = sorted(p.name for p in into.glob("part-*"))
    missing = [n for n in manifest["join"] if n not in here]
    return {"received": [p.name for p in parts], "here": here, "missing": missing, **probe()}


class Joined:
    """The parts read as one stream, in the manifest's order, hashed as they go by."""

    def __init__(self, folder: Path, names: list[str]):
        self.files = [folder / n for n in names]
        self.current: IO[bytes] | None = None
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        out = b""
        while n < 0 or len(out) < n:
            if self.current is None:
                if not self.files:
                    break
                self.current = open(self.files.pop(0), "rb")
            block = self.current.read(-1 if n < 0 else n - len(out))
            if not block:
                self.current.close()
                self.current = None
                continue
            out += block
        self.hash.update(out)
        return out


def join_and_unpack(folder: Path, work: Path) -> dict[str, Any]:
    """Verify every part, then join them and unpack the bundle's members into `work`; the
    joined stream's sha256 is checked against the manifest's too."""
    manifest = read_manifest(folder / "manifest.json")
    missing = [n for n in manifest["join"] if not (folder / n).is_file()]
    if missing:
        raise Refused(f"parts missing from {folder}: {', '.join(missing)}: carry them")
    for name in manifest["join"]:
        verify_part(folder / name, manifest)
    shutil.rmtree(work, ignore_errors=True)
    (work / "bundle").mkdir(parents=True)
    stream = Joined(folder, manifest["join"])
    with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            if not member.isfile() or member.name.startswith("/") or ".." in member.name:
                raise Refused(f"the bundle holds an unexpected entry {member.name!r}")
            target = work / "bundle" / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            with open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    stream.read()  # the tar's end padding, hashed too
    if stream.hash.hexdigest() != manifest["bundle"]["sha256"]:
        raise Refused("the joined parts do not give the manifest's bundle: carry the pack again")
    for name, want in manifest["members"].items():
        if sha256_file(work / "bundle" / name) != want["sha256"]:
            raise Refused(f"bundle member {name} does not match the manifest")
    return manifest


def untar(archive: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="tar")  # the pack's own archives: modes kept, no links out
