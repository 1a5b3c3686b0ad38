"""Free ports (hf2triton.util.net): a port handed out is free, stays out of the kernel's hands, and
is
handed to no one else, in this process or another, until it is released."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from hf2triton.errors import EnvironmentSetupError
from hf2triton.util import net
from tests.conftest import ROOT


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    ports = net.free_ports(20)
    try:
        lo, hi = net.ephemeral_range()
        assert len(set(ports)) == 20
        assert not any(lo <= p <= hi for p in ports)
        servers = [_listen(p) for p in ports]  # what a server does with them next
        for s in servers:
            s.close()
    finally:
        net.release(ports)


def test_two_allocations_in_one_process_never_overlap():
    first, second = net.free_ports(30), net.free_ports(30)
    try:
        assert not set(first) & set(second)
    finally:
        net.release(first + second)


def test_a_port_another_process_reserved_is_not_handed_out():
    wanted = net.free_ports(5)
    spare = net.free_ports(1)
    net.release(wanted + spare)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys
        from hf2triton.util import net
        print(net.free_ports(5, candidates={wanted}), flush=True)
        sys.stdin.read()  # hold them until the test closes our stdin
        """),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == str(wanted)
        # Bindable, but reserved by the other process: only the spare is ours.
        assert net.free_ports(1, candidates=wanted + spare) == spare
        with pytest.raises(EnvironmentSetupError, match="found 0 of 1 free ports"):
            net.free_ports(1, candidates=wanted)
    finally:
        holder.stdin.close()
        holder.wait(30)
        net.release(spare)
    # Its process gone, its reservations are gone with it.
    again = net.free_ports(5, candidates=wanted)
    net.release(again)
    assert again == wanted


def test_a_port_in_use_is_never_returned():
    [taken, spare] = net.free_ports(2)
    net.release([taken, spare])
    server = _listen(taken)  # a server this module knows nothing of
    try:
        with net.reserved_ports(1) as ports:
            assert taken not in ports
        assert net.free_ports(1, candidates=[taken, spare]) == [spare]
        with pytest.raises(EnvironmentSetupError, match="free ports"):
            net.free_ports(1, candidates=[taken])
    finally:
        server.close()
        net.release([spare])


def test_a_released_port_can_be_reserved_again():
    with net.reserved_ports(1) as (port,):
        with pytest.raises(EnvironmentSetupError):
            net.free_ports(1, candidates=[port])  # ours already: not handed out twice
    assert net.free_ports(1, candidates=[port]) == [port]
    net.release([port])
