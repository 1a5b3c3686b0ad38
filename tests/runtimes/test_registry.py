"""One table of runtimes: the serving core's (hf2triton.serving.runtimes.RUNTIMES). Each of its
runtimes has exactly one pipeline plug-in, in a module of the same name, that names its serving
class and takes its name from it; a serving runtime without a plug-in, a plug-in of a class the
table does not hold, or a second plug-in for one class is refused, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf2triton.runtimes import PLUGINS, plugin
from hf2triton.runtimes.base import Plugins, RuntimePlugin
from hf2triton.serving import runtimes as serving_runtimes
from tests.conftest import ROOT


def test_every_serving_runtime_has_one_plugin_of_the_same_name_and_module():
    served = serving_runtimes.RUNTIMES
    assert PLUGINS.missing() == []
    pairs = {p.serving: p for p in PLUGINS.values()}
    assert list(pairs) == list(served.values())  # one each, none extra, in the table's order
    for name, runtime in served.items():
        found = PLUGINS.load(name)
        assert found.serving is runtime and found.name == name == runtime.name
        assert found.__module__.rsplit(".", 1)[1] == runtime.__module__.rsplit(".", 1)[1]


def test_each_side_has_one_module_per_runtime_with_matching_names():
    def runtime_modules(folder: Path) -> set[str]:
        helpers = {"__init__", "base", "devices", "quantization", "quantizers"}
        return {p.stem for p in folder.glob("*.py")} - helpers

    serving = runtime_modules(ROOT / "hf2triton" / "serving" / "runtimes")
    pipeline = runtime_modules(ROOT / "hf2triton" / "runtimes")
    assert serving == pipeline
    assert serving == {p.__module__.rsplit(".", 1)[1] for p in PLUGINS.values()}


def test_a_serving_runtime_without_a_plugin_stops_the_import_check(monkeypatch):
    class Orphan(serving_runtimes.Runtime):
        name = "orphan-runtime"
        devices = ("cpu",)
        precisions = ("fp32",)

    monkeypatch.setitem(serving_runtimes.RUNTIMES, Orphan.name, Orphan)
    assert PLUGINS.missing() == ["orphan-runtime"]
    with pytest.raises(TypeError, match="orphan-runtime have no pipeline plug-in"):
        PLUGINS.check()


def test_a_plugin_outside_the_table_or_a_second_one_is_refused():
    table = Plugins()

    class Unlisted(serving_runtimes.Runtime):
        name = "unlisted"

    class OfUnlisted(RuntimePlugin):
        serving = Unlisted
        device = "cpu"

    with pytest.raises(TypeError, match="OfUnlisted drives Unlisted, which is not in the serving"):
        table.register(OfUnlisted)

    class First(RuntimePlugin):
        serving = serving_runtimes.OpenVino
        device = "cpu"

    class Second(RuntimePlugin):
        serving = serving_runtimes.OpenVino
        device = "cpu"

    assert table.register(First) is First and First.name == "openvino"
    with pytest.raises(TypeError, match="two plug-ins drive runtime 'openvino': First and Second"):
        table.register(Second)


def test_a_runtime_is_looked_up_in_the_serving_table():
    assert plugin(None) is PLUGINS.load("onnxruntime")  # the default runtime
    assert plugin({"name": "onnxruntime-tensorrt"}).serving is serving_runtimes.OnnxRuntimeTensorrt
    with pytest.raises(ValueError, match="runtime 'tvm' is unknown: use one of onnxruntime, "):
        PLUGINS.load("tvm")
