"""The documentation: the site builds with `mkdocs build --strict` (no broken link or anchor),
its spec reference carries every field's description from the spec models and its
troubleshooting page every error code, and the README stays a short guide that links into it."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys

import pytest

from hf2triton import errors
from hf2triton.spec.schema import json_schema
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _text(page) -> str:
    """A built page as a reader sees it: no tags, entities decoded, whitespace collapsed."""
    body = re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8"))
    return " ".join(html.unescape(body).split())


def _descriptions(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["description"]] if isinstance(node.get("description"), str) else []
        return own + [d for v in node.values() for d in _descriptions(v)]
    if isinstance(node, list):
        return [d for v in node for d in _descriptions(v)]
    return []


def _shown(description: str) -> str:
    return " ".join(description.replace("`", "").split())


def test_the_spec_reference_shows_every_field_description_of_the_models(site):
    page = _text(site / "spec-reference" / "index.html")
    package = json_schema("release")["$defs"]["PackageSource"]["properties"]["package"]
    assert _shown(package["description"]) in page
    for which in ("release", "training"):
        missing = [d for d in _descriptions(json_schema(which)) if _shown(d) not in page]
        assert missing == [], f"{which} spec descriptions not in the reference: {missing}"
    assert "deploy.max_batch_tokens" in page and "target: kserve" in page


def test_troubleshooting_lists_every_error_code_with_what_to_do(site):
    page = _text(site / "troubleshooting" / "index.html")
    todo, codes = [errors.Hf2TritonError], []
    while todo:
        cls = todo.pop()
        codes.append(cls.code)
        todo += cls.__subclasses__()
    for code in codes:
        assert page.count(code) >= 2, f"{code}: not in the table and its own section"


def test_the_benchmark_page_dates_its_figures(site):
    page = _text(site / "benchmarks" / "index.html")
    assert "2026-11-23 15:54 UTC" in page and "benchmarks/serving.py" in page
    assert (site / "serving.png").is_file() and (site / "prefect-release-run.png").is_file()


def test_the_readme_is_a_short_guide_whose_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") and link.endswith(".md") for link in local)
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_the_served_runtimes_chart_is_drawn_from_the_committed_records(site, tmp_path):
    """docs/served-runtimes.svg is what benchmarks/chart.py draws from the records beside it
    (re-drawn here: a chart edited by hand or left behind by new records fails), and the
    benchmark page shows it with the figures it plots."""
    import json

    records = sorted((ROOT / "docs" / "data").glob("runtimes-*.json"))
    assert records
    out = tmp_path / "chart.svg"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "chart.py"),
            *map(str, records),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (ROOT / "docs" / "served-runtimes.svg").read_bytes(), (
        "docs/served-runtimes.svg is stale: re-run the command on docs/benchmarks.md"
    )
    svg = out.read_text()
    for path in records:
        record = json.loads(path.read_text())
        served = sorted(r["minilm-embedder"]["rps"] for r in record["rounds"])
        assert f">{served[len(served) // 2]:.0f}<" in svg  # the median, labelled on its bar
        assert record["commit"] in svg
    page = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert 'src="../served-runtimes.svg"' in page and "benchmarks/chart.py" in page
    assert (site / "served-runtimes.svg").is_file()
