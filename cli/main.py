"""The `hf2triton` command: `release SPEC.yaml` runs the release flow locally (no Prefect server
needed); `render SPEC.yaml --output DIR` runs it up to the Triton repository and writes that and
the image build context, registering and deploying nothing; `server status|stop` manage the
local Triton server the releases deploy to; `schema` prints the spec's JSON Schema; `image render
SPEC` writes the spec's serving image Dockerfile without building it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def _fail(message: str, code: int = 1) -> int:
    print(f"hf2triton: error: {' '.join(message.split())}", file=sys.stderr)
    return code


def _release(args: argparse.Namespace) -> int:
    from hf2triton.flows.release import release_model

    return _run_flow(args.spec, release_model)


def _render(args: argparse.Namespace) -> int:
    """`render` (docs/deploy-targets.md#render-only): the release's steps up to its Triton
    repository, written with the image build context to --output; nothing registered or
    deployed."""
    from hf2triton.errors import Hf2TritonError
    from hf2triton.flows.render import render_release
    from hf2triton.release.render import check_output

    try:
        check_output(Path(args.output).resolve())  # before minutes of steps, not after them
    except Hf2TritonError as exc:
        return _fail(f"[{exc.code}] {exc}", exc.exit_code)

    def run(spec: Any) -> dict[str, Any]:
        found = render_release(spec, args.output)
        # Every file's sha256 is in render.json; the line says where and what.
        return {k: v for k, v in found.items() if k not in ("files", "image_context")}

    return _run_flow(args.spec, run)


def _run_flow(spec_path: str, run: Any) -> int:
    """Check the spec, its data and the gate's device up front, then run `run(spec)` locally;
    its result is stdout's one JSON line."""
    from hf2triton.errors import Hf2TritonError, SpecError
    from hf2triton.orchestration.prefect_api import prepare_local_run
    from hf2triton.runtimes.devices import check_gate_device
    from hf2triton.spec import kind_for, load_spec

    try:
        spec = load_spec(spec_path)
        kind_for(spec).read_data()  # unusable validation data fails up front
    except SpecError as exc:
        return _fail(str(exc), 2)
    try:
        spec.source.check_up_front()  # a local model folder that is none fails now
        check_gate_device(spec.deploy)  # a GPU release needs a GPU to gate on, up front too
    except Hf2TritonError as exc:
        return _fail(f"[{exc.code}] {exc}", exc.exit_code)
    try:
        prepare_local_run()
    except Hf2TritonError as exc:
        return _fail(f"[{exc.code}] {exc}", exc.exit_code)
    return _run_release(spec, run)


def _run_release(spec, run: Any) -> int:
    from hf2triton.errors import Hf2TritonError
    from hf2triton.orchestration.prefect_api import stop_temporary_api

    try:
        try:
            # stdout carries exactly one JSON line; libraries that print (MLflow's "View run
            # at") go to stderr with the progress.
            with contextlib.redirect_stdout(sys.stderr):
                summary = run(spec)
        finally:
            stop_temporary_api()  # now, not at exit: the last line printed is ours
    except Hf2TritonError as exc:
        return _fail(f"[{exc.code}] {exc}", exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted; finished steps are kept and a re-run reuses them", 130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence prints one line
        return _fail(
            f"[UNEXPECTED] {type(exc).__name__}: {exc}. Re-run with "
            "PREFECT_LOGGING_LEVEL=DEBUG for details and report it."
        )
    print(json.dumps(summary, sort_keys=False), flush=True)
    return 0


def _server(args: argparse.Namespace) -> int:
    from hf2triton.targets import triton_local

    if args.action == "status":
        info = triton_local.status()
        print(json.dumps(info, indent=1))
        return 0 if info["running"] else 3
    from hf2triton.targets.balancer import stop_fronts

    stopped = triton_local.stop_server()
    print(
        f"stopped tritonserver pid {stopped.pid} and the OpenAI-compatible API beside it"
        if stopped
        else "no local Triton server runs"
    )
    for model in stop_fronts():
        print(f"stopped the front (HAProxy) of {model}'s replicas")
    return 0


def _deployments(args: argparse.Namespace) -> int:
    from hf2triton.errors import SpecError
    from hf2triton.orchestration.deployments import release_specs, render, training_specs
    from hf2triton.util.workspace import PROJECT_ROOT

    target = PROJECT_ROOT / "prefect.yaml"
    try:
        text = render(release_specs(), training_paths=training_specs())
    except SpecError as exc:
        return _fail(str(exc), 2)
    if args.check:
        if not target.is_file() or target.read_text() != text:
            return _fail(
                f"{target} is out of date with releases/: run `hf2triton deployments render`"
            )
        return 0
    target.write_text(text)
    print(f"wrote {target}", file=sys.stderr)
    return 0


def _schema(args: argparse.Namespace) -> int:
    from hf2triton.spec.schema import SCHEMAS, render, stale
    from hf2triton.util.workspace import PROJECT_ROOT

    which = "training" if args.training else "release"
    if args.check is not None:
        path = Path(args.check or PROJECT_ROOT / SCHEMAS[which].path)
        problem = stale(which, path)
        if problem:
            flag = " --training" if args.training else ""
            return _fail(f"{problem}: run `hf2triton schema{flag} --output {path}`")
        return 0
    if args.output:
        try:
            Path(args.output).write_text(render(which), encoding="utf-8")
        except OSError as exc:
            return _fail(f"cannot write {args.output}: {exc.strerror or exc}", 2)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(render(which), end="")
    return 0


def _store(args: argparse.Namespace) -> int:
    from hf2triton.errors import Hf2TritonError, SpecError
    from hf2triton.spec import load_spec

    try:
        store = getattr(load_spec(args.spec).deploy, "model_store", None)
    except SpecError as exc:
        return _fail(str(exc), 2)
    if store is None or not store.shared:
        return _fail(
            f"{args.spec}: deploy.model_store is "
            f"{store.kind if store else 'not read by this target'!r}; `store init` "
            "prepares a store that servers share (kind s3)",
            2,
        )
    try:
        store.prepare()
    except Hf2TritonError as exc:
        return _fail(f"[{exc.code}] {exc}")
    # What each Triton replica is started with (credentials go in its environment).
    print(f"--model-repository={store.triton_uri()}")
    return 0


def _image(args: argparse.Namespace) -> int:
    from hf2triton.errors import SpecError
    from hf2triton.image import image_target, render_context
    from hf2triton.spec import load_spec

    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        return _fail(str(exc), 2)
    # The version and release key are only known after registration: the tag shown is a sample.
    target = image_target(
        spec.image, spec.image_repository, "VERSION", "0" * 64, spec.deploy.device
    )
    out = Path(args.output)
    try:
        for path in render_context(target, out):
            print(f"wrote {path}", file=sys.stderr)
    except OSError as exc:
        return _fail(f"cannot write the build context into {out}: {exc.strerror or exc}", 2)
    print(
        f"build it (once the release's wheelhouse/ and model_repository/ are beside it): "
        f"docker build --build-arg BASE_IMAGE={target['base_image']} {out}",
        file=sys.stderr,
    )
    return 0


def _release_spec(name: str):
    """A spec file, the name of one in releases/, or a release this home has run."""
    from hf2triton.errors import SpecError
    from hf2triton.spec import load_spec, parse_spec
    from hf2triton.util.workspace import PROJECT_ROOT
    from hf2triton.watch.status import remembered

    path = Path(name)
    if not path.is_file() and (PROJECT_ROOT / "releases" / f"{name}.yaml").is_file():
        path = PROJECT_ROOT / "releases" / f"{name}.yaml"
    if not path.is_file():
        ran = [data for data in remembered() if data.get("name") == name]
        if ran:
            return parse_spec(ran[0])
        if not path.exists():
            known = sorted({str(data.get("name")) for data in remembered()})
            raise SpecError(
                f"{name!r} is no spec file, no releases/{name}.yaml and no release this home "
                f"has run ({', '.join(known) or 'none yet'}): `hf2triton status` lists them"
            )
    return load_spec(path)


def _rollback(args: argparse.Namespace) -> int:
    """`rollback` (docs/watch.md): what its deployment runs."""
    from hf2triton.errors import Hf2TritonError, SpecError
    from hf2triton.watch.rollback import roll_back

    try:
        spec = _release_spec(args.release)
    except SpecError as exc:
        return _fail(str(exc), 2)
    try:
        out = roll_back(spec, args.reason, to=args.to)
    except Hf2TritonError as exc:
        return _fail(f"[{exc.code}] {exc}", exc.exit_code)
    print(json.dumps(out, indent=1, default=str))
    return 0


def _status(args: argparse.Namespace) -> int:
    """`status` (docs/watch.md): every release this home has run as a table, or one in full;
    `--json` the objects for scripts."""
    from hf2triton.errors import Hf2TritonError, SpecError
    from hf2triton.spec import parse_spec
    from hf2triton.util.workspace import home
    from hf2triton.watch import status

    try:
        specs = (
            [_release_spec(args.release)]
            if args.release
            else [parse_spec(data) for data in status.remembered()]
        )
    except SpecError as exc:
        return _fail(str(exc), 2)
    if not specs:
        print(f"no release has run with the hf2triton home {home()} yet", file=sys.stderr)
        return 0
    try:
        found = [status.status(spec) for spec in specs]
    except Hf2TritonError as exc:
        return _fail(f"[{exc.code}] {exc}", exc.exit_code)
    if args.json:
        print(json.dumps(found[0] if args.release else found, indent=1, default=str))
    elif args.release:
        print(status.describe(found[0]))
    else:
        print(status.table([status.row(f) for f in found]))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf2triton", description="Release Hugging Face models to Triton Inference Server."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _release_commands(sub)
    _tool_commands(sub)
    return parser


def _release_commands(sub: Any) -> None:
    """Release, follow and roll back: what an ML engineer runs."""
    rel = sub.add_parser("release", help="run a release from a spec file, locally")
    rel.add_argument("spec", help="release spec YAML, e.g. releases/minilm-embedder.yaml")
    rel.set_defaults(func=_release)
    ren = sub.add_parser(
        "render",
        help="the release's steps up to its Triton model repository (gate included), written "
        "with the serving image's build context to a folder: nothing registered or deployed",
    )
    ren.add_argument("spec", help="release spec YAML (any deploy.device and target)")
    ren.add_argument(
        "--output",
        metavar="DIR",
        required=True,
        help="where to write model_repository/, the image build context and render.json (a "
        "new or empty folder, or an earlier render, which is replaced)",
    )
    ren.set_defaults(func=_render)
    st = sub.add_parser(
        "status",
        help="every release this home has run, as a table: champion, "
        "candidate, what serves where, the watch's verdict; or one in full",
    )
    st.add_argument(
        "release",
        nargs="?",
        help="one release: its spec YAML, its name in "
        "releases/, or the name of a release this home has run",
    )
    st.add_argument("--json", action="store_true", help="the status objects, for scripts")
    st.set_defaults(func=_status)
    rb = sub.add_parser(
        "rollback", help="serve the previous champion again (checked before the alias moves back)"
    )
    rb.add_argument("release", help="release spec YAML, or its name in releases/")
    rb.add_argument(
        "--to",
        metavar="VERSION",
        help="the version to serve (default: the one the champion replaced)",
    )
    rb.add_argument(
        "--reason",
        default="rolled back by hand (hf2triton rollback)",
        help="why, recorded on the MLflow version rolled back from",
    )
    rb.set_defaults(func=_rollback)


def _tool_commands(sub: Any) -> None:
    """The server, the Prefect deployments, the schema, the store and the image: set-up."""
    srv = sub.add_parser(
        "server", help="the local Triton server releases deploy to (stop: the replicas' fronts too)"
    )
    srv.add_argument("action", choices=["status", "stop"])
    srv.set_defaults(func=_server)
    dep = sub.add_parser("deployments", help="render prefect.yaml from releases/*.yaml")
    dep.add_argument("action", choices=["render"])
    dep.add_argument("--check", action="store_true", help="fail if prefect.yaml is stale")
    dep.set_defaults(func=_deployments)
    sch = sub.add_parser("schema", help="print the release spec's JSON Schema (for editors)")
    sch.add_argument("--training", action="store_true", help="the training spec's instead")
    sch.add_argument("--output", metavar="FILE", help="write it to FILE instead of stdout")
    sch.add_argument(
        "--check",
        metavar="FILE",
        nargs="?",
        const="",
        help="fail if FILE (default: the committed schema/*.json) is stale",
    )
    sch.set_defaults(func=_schema)
    sto = sub.add_parser("store", help="the spec's S3 model store")
    sto.add_argument(
        "action",
        choices=["init"],
        help="init: check the bucket and credentials and "
        "create the repository folder Triton replicas start on",
    )
    sto.add_argument("spec", help="release spec YAML with deploy.model_store kind s3")
    sto.set_defaults(func=_store)
    img = sub.add_parser("image", help="the spec's serving image, without building it")
    img.add_argument(
        "action",
        choices=["render"],
        help="render: write its Dockerfile, the "
        "requirement lists it installs from the wheelhouse and its build arguments",
    )
    img.add_argument("spec", help="release spec YAML (deploy.device picks the CPU or GPU image)")
    img.add_argument(
        "--output",
        metavar="DIR",
        default="image-context",
        help="where to write them (default: ./image-context)",
    )
    img.set_defaults(func=_image)


def main(argv: list[str] | None = None) -> int:
    import faulthandler
    import signal

    from hf2triton.orchestration.prefect_api import set_process_defaults

    # `kill -USR1 PID` prints where every thread of a release that seems stuck is, to stderr
    # (docs/troubleshooting.md); the release goes on.
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)

    args = _parser().parse_args(argv)
    # The tokenizers thread pool warns (and can deadlock) once Prefect forks workers.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_process_defaults()  # before anything imports Prefect
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
