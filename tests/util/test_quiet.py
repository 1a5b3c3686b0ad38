"""Library messages dropped at their source: only the records and warnings named are dropped,
everything else still reaches the user."""

from __future__ import annotations

import logging
import warnings

import pytest

from hf2triton.util.quiet import drop_log_message, dropped, ignored_warnings


@pytest.fixture()
def records():
    """What reaches a handler on the root logger."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.name}: {record.getMessage()}")

    handler = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.DEBUG)
    yield seen
    root.setLevel(old)
    root.removeHandler(handler)


def test_drop_log_message_drops_only_that_loggers_records_with_that_prefix(records):
    drop_log_message("tests.quiet.lib", "Some weights of")
    drop_log_message("tests.quiet.lib", "Some weights of")  # twice is once
    lib = logging.getLogger("tests.quiet.lib")
    lib.warning("Some weights of the model were not used")
    lib.warning("the tokenizer has no pad token")
    logging.getLogger("tests.quiet.other").warning("Some weights of another library")
    assert records == [
        "tests.quiet.lib: the tokenizer has no pad token",
        "tests.quiet.other: Some weights of another library",
    ]
    assert len(lib.filters) == 1


def test_dropped_drops_only_inside_the_block(records):
    log = logging.getLogger("tests.quiet.block")
    with dropped("tests.quiet.block", "TracerWarning"):
        log.warning("TracerWarning: converting a tensor")
        log.warning("export finished")
    log.warning("TracerWarning: after the block")
    assert records == [
        "tests.quiet.block: export finished",
        "tests.quiet.block: TracerWarning: after the block",
    ]
    assert log.filters == []


def test_dropped_with_no_name_filters_the_root_logger(records):
    with dropped("", "noise"):
        logging.getLogger().warning("noise from a library logging through the root")
        logging.getLogger().warning("a message for the user")
    assert records == ["root: a message for the user"]


def test_ignored_warnings_ignores_only_that_category():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ignored_warnings(DeprecationWarning):
            warnings.warn("old API", DeprecationWarning, stacklevel=1)
            warnings.warn("slow path", UserWarning, stacklevel=1)
        warnings.warn("old API after", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["slow path", "old API after"]
