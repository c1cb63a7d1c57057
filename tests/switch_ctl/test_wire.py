"""The manager's line parser (wire.decode_line) against lines built to hurt it: each
is refused with one BadRequest line, never an exception of another kind, and
quickly. No root, no manager: the manager's listener refuses exactly what this
refuses (test_manager_listener.py sends some of these to a real one)."""

from __future__ import annotations

import json
import time

import pytest

from innet_aggregation.switch_ctl.manager.wire import (MAX_DEPTH, MAX_LINE, MAX_NUMBER,
                                                       BadRequest, decode_line, encode,
                                                       parse, secret_of)

REGISTER = {"op": "register", "secret": "s" * 20, "job": "job-a", "rank": 0, "world": 2,
            "interfaces": [{"ifname": "eth0", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}],
            "udp_port": 40000, "credential": "credential-of-job-a", "token": "3" * 32}


def refused(line: bytes) -> str:
    started = time.perf_counter()
    with pytest.raises(BadRequest) as err:
        decode_line(line)
    assert time.perf_counter() - started < 0.05, "a bounded line took long to refuse"
    said = str(err.value)
    assert "\n" not in said and len(said) < 200, said
    return said


@pytest.mark.parametrize("line,said", [
    (b"x" * (MAX_LINE + 1) + b"\n", f"at most {MAX_LINE} bytes"),
    (b'{"op":"jobs"}', "one JSON line"),                       # no newline
    (b"[" * 100_000 + b"\n", f"at most {MAX_LINE} bytes"),
    (b"[" * (MAX_LINE - 1) + b"\n", f"nest more than {MAX_DEPTH} deep"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"\n", f"nest more than {MAX_DEPTH}"),
    (b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n", f"nest more than {MAX_DEPTH}"),
    (b'{"rank":' + b"7" * 5000 + b"}\n", "a number of 5000 characters; at most 24"),
    (b'{"rank":-' + b"7" * 25 + b"}\n", "a number of 26 characters"),
    (b'{"rank":1' + b"0" * 5000 + b".5}\n", "a number of 5003 characters"),
    (b'{"rank":1e999999}\n', "the number 1e999999 is beyond a double's range"),
    (b'{"rank":-1E400}\n', "beyond a double's range"),
    (b'{"rank":NaN}\n', "NaN is not a number JSON allows"),
    (b'{"rank":Infinity}\n', "Infinity is not a number JSON allows"),
    (b'{"rank":-Infinity}\n', "-Infinity is not a number JSON allows"),
    (b'{"job":"\xff\xfe"}\n', "not UTF-8: invalid start byte at byte 8"),
    (b'\xff\xfe{\x00}\x00\n', "not UTF-8"),                     # UTF-16 is not taken either
    (b'{"job":"caf\xc3"}\n', "not UTF-8"),
    (b'{"job": "a"\n', "not JSON: Expecting ',' delimiter"),
    (b'{"job": "a"} {}\n', "not JSON: Extra data"),
    (b"\n", "not JSON: Expecting value"),
    (b'["op", "jobs"]\n', "a request is a JSON object"),
    (b'{"a":"[[[[' + b"[" * 40 + b'}\n', "nest more than"),     # a string left open
])
def test_hostile_lines_are_one_line_refusals(line, said):
    assert said in refused(line)


def test_brackets_inside_strings_do_not_count_and_the_limits_are_inclusive():
    deep_in_a_string = {**REGISTER, "job": "[" * 100, "secret": '{"[\\"' * 50}
    assert decode_line(encode(deep_in_a_string)) == deep_in_a_string
    nested = json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert decode_line(encode({"a": nested[0]}))            # MAX_DEPTH in all
    widest = {"int": -(10 ** (MAX_NUMBER - 2)), "float": -1.2345678901234567e-308}
    assert decode_line(encode(widest)) == widest


def test_a_request_and_an_answer_pass_unchanged():
    assert parse(decode_line(encode(REGISTER))).interfaces[0].ip == "10.0.0.1"
    # The deepest answer: a tree job's configuration, as the manager hands it out.
    answer = {"status": "ready", "lease_seconds": 3.0,
              "config": {"job": {"id": 1, "values_per_packet": 256}, "tree": {"root": "spine"},
                         "switches": {"leaf0": {"workers": [{"id": 0, "ip": "10.0.0.1"}]}},
                         "loss": {"ingress": 0.0, "egress": 0.0}}}
    assert decode_line(encode(answer)) == answer


def test_a_secret_that_is_not_unicode_is_a_bad_request():
    message = decode_line(b'{"op":"jobs","secret":"\\ud800"}\n')       # a lone surrogate
    with pytest.raises(BadRequest, match="the secret is not valid Unicode"):
        secret_of(message)
