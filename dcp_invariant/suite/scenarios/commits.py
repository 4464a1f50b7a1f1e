"""A scenario's commits as its driver makes them, and the labels the evidence gives digests.

Torch-free: on this machine the runner commits; in a torchrun job rank 0 does
(:mod:`dcp_invariant.suite.torchrun.in_job`), and every rank labels digests alike.
"""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from dcp_invariant import canonical, dcp_layout
from dcp_invariant.commit import (
    CheckpointStore,
    Failure,
    PromotionRefused,
    SealError,
    after_save,
    receipt,
    tree,
)
from dcp_invariant.evidence.diagnosis import WRITTEN_AFTER_SAVE
from dcp_invariant.evidence.families.records import CommitRecord, FailureRecord, FileSize


class Interner:
    """Stable labels for digests that differ between runs (receipts, pointers).

    DCP writes a fresh UUID into every ``.metadata``, so receipt digests change from run to run;
    their equalities do not. Labels are handed out in order of first appearance.
    """

    def __init__(self) -> None:
        self._labels: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = {}

    @property
    def met(self) -> list[tuple[str, str]]:
        """``(kind, digest)`` in the order first met: :meth:`meet` hands out the same labels."""
        return list(self._labels)

    def meet(self, met: Iterable[Sequence[str]]) -> None:
        """Meet another interner's :attr:`met`, in order, having met a prefix of it: this one
        then labels as that one does (another rank's, or this process's before a restart)."""
        for kind, digest in met:
            self(kind, digest)

    def __call__(self, kind: str, digest: str | None) -> str | None:
        if digest is None:
            return None
        key = (kind, digest)
        if key not in self._labels:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            self._labels[key] = f"{kind}-{self._counts[kind]}"
        return self._labels[key]


def pointer_label(store: CheckpointStore, intern: Interner) -> str | None:
    raw = store.pointer_bytes()
    return intern("pointer", None if raw is None else hashlib.sha256(raw).hexdigest())


def commit(
    store: CheckpointStore,
    label: str,
    intern: Interner,
    damage: Callable[[Path], None] | None = None,
    refused: tuple[str, str] | None = None,
) -> CommitRecord:
    """Seal ``label``, let ``damage`` act on the sealed candidate, then try to promote it; the
    commit record, with digests as ``intern`` labels them.

    ``refused``: an entry (relative path, kind) the copy of a shared group's save left out, a
    FIFO, socket or device it must not read; refused as the seal refuses one in place. What
    changed in the candidate since its ranks' save() returned is refused too
    (:mod:`dcp_invariant.commit.after_save`), and the commit's files are those that did not."""
    # The fields after the attempt (candidate_retained, pointer_after, generations_after)
    # are read once it is over; a driver error before then returns no record at all.
    record: CommitRecord = {
        "label": label,
        "sealed": False,
        "seal_error": None,
        "receipt": None,
        "files": _listing(store.candidate(label)),
        "promoted": False,
        "refused": [],
        "candidate_retained": False,
        "pointer_before": pointer_label(store, intern),
        "pointer_after": None,
        "generations_before": len(store.generation_names()),
        "generations_after": 0,
    }
    try:
        _refuse_before_seal(store, label, refused, record)
        sealed = store.seal(label)
    except SealError as exc:
        record["seal_error"] = str(exc)
    else:
        record["sealed"] = True
        record["receipt"] = intern("receipt", sealed.digest)
        record["files"] = [{"path": f.path, "size": f.size} for f in sealed.files]
        if damage is not None:
            damage(store.candidate(label))
        try:
            store.promote(label)
        except PromotionRefused as exc:
            record["refused"] = _failures(exc.failures)
        else:
            record["promoted"] = True
    record["candidate_retained"] = store.candidate(label).is_dir()
    record["pointer_after"] = pointer_label(store, intern)
    record["generations_after"] = len(store.generation_names())
    return record


def _refuse_before_seal(
    store: CheckpointStore, label: str, refused: tuple[str, str] | None, record: CommitRecord
) -> None:
    """Raise the seal's error for what the copy left out, then for what changed since save()
    returned (that error starts with its cause class); its files then are those that did not."""
    if refused is not None:
        shown = canonical.printable(refused[0])
        raise receipt.unsealable(shown, refused[1], nested=store.marker is None)
    late = after_save.changed(store.candidate(label))
    if late is not None:
        record["files"] = [f for f in record["files"] if f["path"] not in late.paths]
        raise SealError(f"{WRITTEN_AFTER_SAVE}: {late.first}")


def _failures(failures: list[Failure]) -> list[FailureRecord]:
    """The protocol's failures as a commit record holds them (``Failure.to_record``, typed)."""
    return [{"path": f.path, "reason": f.reason} for f in failures]


def _listing(directory: Path) -> list[FileSize]:
    """Regular files in a candidate that could not be sealed, at any depth, by relative path:
    what a crashed writer left. Symlinks are never followed, directories entered no deeper than
    a receipt's, and as many files listed as a commit record holds."""
    if not directory.is_dir():
        return []
    out: list[FileSize] = [
        {"path": canonical.printable(rel), "size": st.st_size}
        # Unreadable too: the seal's error says what it met.
        for rel, st in tree.walk(directory, skipped=(OSError,))
        if stat.S_ISREG(st.st_mode)
    ]
    out.sort(key=lambda f: f["path"])
    return out[: dcp_layout.MAX_FILES]
