"""A built variant's size and hash cover every graph it is read with: Whisper's decoder IR beside
its encoder's (the variant's main graph), each with its weights, and nothing else in the folder."""

from __future__ import annotations

from pathlib import Path

from hf2triton.runtimes.base import VariantId, build_variant


def write_irs(decoder: bytes):
    def build(out: Path) -> dict:
        (out / "encoder.xml").write_bytes(b"e" * 10)
        (out / "encoder.bin").write_bytes(b"E" * 1000)
        (out / "decoder.xml").write_bytes(b"d" * 20)
        (out / "decoder.bin").write_bytes(decoder)
        (out / "config.json").write_text("{}")
        return {}

    return build


def test_a_variant_of_several_graphs_counts_and_hashes_them_all(tmp_path):
    source = tmp_path / "source.xml"
    source.write_text("x")
    made = VariantId("ir", "some-ir", source, "encoder.xml", ("decoder.xml",))
    one = build_variant(str(tmp_path / "work"), "irs", [1], write_irs(b"D" * 3000), made)
    assert Path(one["onnx_path"]).name == "encoder.xml"
    assert one["size_bytes"] == 10 + 1000 + 20 + 3000  # both graphs and weights, no config
    other = build_variant(str(tmp_path / "work"), "irs", [2], write_irs(b"F" * 3000), made)
    assert other["size_bytes"] == one["size_bytes"]
    assert other["sha256"] != one["sha256"]  # a different decoder is a different variant
    alone = VariantId("ir", "some-ir", source, "encoder.xml")
    first = build_variant(str(tmp_path / "work"), "irs", [1], write_irs(b"D" * 3000), alone)
    assert first["size_bytes"] == 1010  # one graph: its own files only
