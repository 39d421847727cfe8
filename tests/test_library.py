"""The library's choice of what to send with ``Done``: a result kept live is pickled at
once only when ``dask.sizeof`` can vouch that it is small."""

from __future__ import annotations

import numpy as np

from daskvine_py.plan.graph import LegacyCall
from daskvine_py.wire.serialize import TaskDecoder, TaskEncoder, loads
from daskvine_py.worker import library, pipe


class Opaque:
    """A type ``dask.sizeof`` does not know: ``sys.getsizeof`` sees 48 bytes."""

    def __init__(self, n):
        self.payload = np.ones(n)


def make_int():
    return 7


def make_opaque():
    return Opaque(100_000)  # 800 kB that sizeof cannot see


def make_array(n):
    return np.ones(n)


def run(func, *args, keep=True, send=False):
    encoder = TaskEncoder()
    payload, _ = encoder.encode(LegacyCall((func, *args), frozenset()))
    decoder = TaskDecoder()
    decoder.add_functions(encoder.functions)
    live: dict = {}
    call = pipe.Call(1, "k", payload, [], keep, send)
    return library.run(call, decoder, "w", live), live


def test_a_small_result_of_a_sized_type_is_sent_as_well_as_kept():
    done, live = run(make_int)
    assert done.live and live[1] == 7 and loads(done.value) == 7
    done, live = run(make_array, 10)
    assert done.live and np.array_equal(loads(done.value), np.ones(10))


def test_a_result_sizeof_cannot_size_stays_live_only():
    done, live = run(make_opaque)
    assert type(done) is pipe.Done and done.live and done.value is None
    assert live[1].payload.nbytes == 800_000


def test_a_large_result_stays_live_and_an_asked_for_one_is_sent():
    done, live = run(make_array, 100_000)
    assert done.live and done.value is None and done.nbytes >= 800_000
    done, live = run(make_opaque, send=True)  # an output: always sent
    assert loads(done.value).payload.nbytes == 800_000 and done.live
