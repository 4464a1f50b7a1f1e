"""Evidence as no CPU can change it: for comparing a run with one recorded on another machine.

torch picks its CPU kernels by instruction set (aten/src/ATen/native/DispatchStub.cpp) and its
BLAS by CPU model, so two machines with the same torch, Python and OS may differ in the last bit
of a float result. The example fixture's losses did, on two CPUs that both report AVX512. What
float arithmetic decides is therefore compared as present, not by its bits:

- a loss (``float.hex``) and a Python float attribute (``float 0x1.8p-3``);
- the digest of a float tensor or array (``float64[32] <sha256>``), and of checkpoint bytes;
- the label a written artifact gives a float tensor's digest (``float64[32] ~23``), and so
  which float tensors happen to share one.

Everything else is compared exactly: verdicts, keys, shapes, counts, and the digests and labels
of exact values (integers, booleans, strings, generator and RNG states). Labels are numbered by
first appearance over all digests (``dcp_invariant/evidence/object_causes.py``, ``_intern``),
so one float tensor that is bit-equal to an earlier one on one machine and not on another
shifts every later label; the exact ones are therefore renumbered among themselves, which keeps
which exact values are equal and drops the numbers float values took.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from dcp_invariant import canonical

_HEX_FLOAT = re.compile(r"-?0x[0-9a-f]+(?:\.[0-9a-f]*)?p[-+]?\d+")
# A fingerprint: its kind (one word or more: "float64[32]", "ndarray float64[3]", "Generator"),
# then a digest or a label.
_FINGERPRINT = re.compile(r"(?P<kind>\S+(?: \S+)*) (?:(?P<digest>[0-9a-f]{64})|~(?P<label>\d+))")
_DIGEST = re.compile(r"[0-9a-f]{64}")
# Kinds whose values float arithmetic makes: torch's and NumPy's floating and complex dtypes
# (float8_e4m3fn and bfloat16 included), Python's float, and quantized tensors (their integers
# are floats rounded at a float scale).
_FLOAT_KIND = re.compile(r"(?:^| )(?:b?float|complex|qu?int)\w*(?:\[|$| )")
FLOAT_VALUE = "<float>"
FLOAT_DIGEST = "<float digest>"


def comparable(value: object) -> object:
    """``value`` (canonical JSON) with what float arithmetic decided replaced by its kind, and
    the labels of exact values renumbered by their first appearance in ``value``."""
    return _Masking().mask(value)


def is_float_kind(kind: str) -> bool:
    """Whether float arithmetic makes a value of this kind (``float64[32]``, ``float``)."""
    return _FLOAT_KIND.search(kind) is not None


class _Masking:
    def __init__(self) -> None:
        self._labels: dict[str, str] = {}  # an exact value's label: its number among exact ones

    def mask(self, value: object) -> object:
        # Dicts in key order: canonical JSON sorts its keys, so both sides walk alike.
        if isinstance(value, dict):
            return {k: self.mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.mask(v) for v in value]
        return self._leaf(value) if isinstance(value, str) else value

    def _leaf(self, text: str) -> str:
        if _HEX_FLOAT.fullmatch(text):
            return FLOAT_VALUE
        if _DIGEST.fullmatch(text):
            return FLOAT_DIGEST  # checkpoint bytes: they hold the floats
        if text.startswith("float ") and _HEX_FLOAT.fullmatch(text.removeprefix("float ")):
            return f"float {FLOAT_VALUE}"  # an attribute's Python float
        found = _FINGERPRINT.fullmatch(text)
        if found is None:
            return text
        kind = found["kind"]
        if is_float_kind(kind):
            return f"{kind} {FLOAT_DIGEST}"
        if found["label"] is None:
            return text
        label = self._labels.setdefault(found["label"], f"~{len(self._labels) + 1}")
        return f"{kind} {label}"


def differing_files(
    mine: Path, theirs: Path, files: Iterable[str], observations: set[str]
) -> list[str]:
    """The ``files`` (relative) of two artifacts that differ: the ``observations`` compared as
    :func:`comparable` leaves them, every other file byte for byte."""
    differ = []
    for rel in files:
        a, b = (mine / rel).read_bytes(), (theirs / rel).read_bytes()
        if rel in observations:
            same = comparable(canonical.loads(a)) == comparable(canonical.loads(b))
        else:
            same = a == b
        if not same:
            differ.append(rel)
    return differ
