"""A pickle interpreter that imports nothing and calls nothing: the opcodes, read by hand.

``pickle.Unpickler`` imports every global a file names and calls whatever REDUCE, NEWOBJ and
BUILD point it at; a subclass that only overrides ``find_class`` still leaves ``persistent_load``,
the extension registry (EXT1/2/4) and INST/OBJ to close. So this reads the byte stream itself,
following the semantics of CPython's Lib/pickle.py ``_Unpickler`` opcode by opcode for the data
opcodes of protocols 0 to 5, and gives each admitted global (:mod:`.admitted`) a stand-in:

* a record class becomes an :class:`Instance` that NEWOBJ creates and BUILD fills in once;
* a reducer becomes the plain value REDUCE would build (``torch.Size`` -> a tuple of ints);
* a dtype is a plain value.

Every other global, INST/OBJ, EXT1/2/4, PERSID/BINPERSID, out-of-band buffers and sets are
refused (:class:`RefusedPickle`, naming the global or the opcode), as is REDUCE, NEWOBJ or BUILD
of anything but an admitted stand-in. Lengths are checked against what is left before anything
is sliced, so a 2 GiB length prefix costs nothing; text integers are bounded before they are
converted, so the interpreter's int-string limit never decides the outcome. Memory grows
linearly with the size of the pickle, never more, and so does the work: an opcode that copies or
checks a long tuple (REDUCE of ``torch.Size``, a tuple as a dict key) counts it against the
file's work budget (:mod:`.budget`) each time, as a memo reference names it for two bytes.

A checkpoint's chunks and storage entries are one record each, written alike a million times:
templates (``_Templates``, below) read those whole, each record with one regular-expression
match, and build what the opcodes would build, never more than the opcodes would take.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import operator
import pickletools
import re
import struct
import threading
from collections.abc import Callable
from typing import Final, TypeGuard, cast

from dcp_invariant.inspection import admitted, records
from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.errors import MalformedMetadata, MetadataTooLarge, RefusedPickle

HIGHEST_PROTOCOL: Final = 5
# A text integer (protocol 0's INT, LONG, GET, PUT) longer than this is refused unconverted.
MAX_TEXT_NUMBER: Final = 64
# A tuple up to this long is checked where it is used; a longer one costs its length in work
# (:mod:`.budget`) each time, as a memo reference can name it again for two bytes.
_INLINE_DIMS: Final = 8
_U32: Final = struct.Struct("<I").unpack_from
_I32: Final = struct.Struct("<i").unpack_from
UNSET: Final = object()
_DEFERRED: Final = object()  # the state of a record a template read, until it is asked for


class Instance:
    """An admitted record class after NEWOBJ: ``state`` is what BUILD gave it, once.

    A record a template read and deferred (below) is one of these too, with ``record``, what
    :mod:`.metadata` makes of it (a ChunkStorageMetadata, or the row of a storage entry), and
    ``recipe``, how to make its state and the memo entries its opcodes made: those are made
    when something asks for them (``state``, or a memo reference to one of them), which a real
    file never does; then ``record`` and ``recipe`` are None, as for any other.
    """

    __slots__ = ("_state", "base", "cls", "recipe", "record")

    def __init__(self, cls: admitted.Global, state: object = UNSET) -> None:
        self.cls = cls
        self._state = state
        self.record: object = None
        self.recipe: _Recipe | None = None
        self.base = 0  # with a recipe: its memo entry, the first of those its opcodes made

    @property
    def state(self) -> object:
        if self.recipe is not None:
            self.recipe.make(self)
        return self._state

    @state.setter
    def state(self, value: object) -> None:
        self._state = value

    @property
    def built(self) -> bool:
        return self._state is not UNSET


class PickledDict:
    """A dict as SETITEM(S) filled it: the pairs in order, never hashed here.

    Converting to a real dict happens later, with keys of known types only (:mod:`.metadata`).
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[object, object]] | None = None) -> None:
        self.pairs: list[tuple[object, object]] = [] if pairs is None else pairs


# Opcodes DCP's metadata never holds and that could reach code: refused, never interpreted.
_REFUSED: Final = {
    "INST": "names a class and calls it",
    "OBJ": "calls a class",
    "EXT1": "looks up the copyreg extension registry",
    "EXT2": "looks up the copyreg extension registry",
    "EXT4": "looks up the copyreg extension registry",
    "PERSID": "calls persistent_load",
    "BINPERSID": "calls persistent_load",
    "NEXT_BUFFER": "reads an out-of-band buffer",
    "READONLY_BUFFER": "reads an out-of-band buffer",
    "EMPTY_SET": "builds a set (hashes arbitrary values)",
    "ADDITEMS": "builds a set (hashes arbitrary values)",
    "FROZENSET": "builds a set (hashes arbitrary values)",
    "BYTEARRAY8": "builds a bytearray",
}
_NAMES: Final = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
_SCALAR_KEYS: Final = (str, int, float, bytes, type(None))
_HASHABLE_RECORDS: Final = (
    records.DType,
    records.Layout,
    records.PathValue,
    admitted.MemoryFormatEncoding,
    admitted.Global,
)
_SIMPLE_KEYS: Final = (*_SCALAR_KEYS, *_HASHABLE_RECORDS)
_RECORD_CLASS: Final = operator.attrgetter("cls.record")
_STATE: Final = operator.attrgetter("_state")


def load(data: bytes, budget: Budget | None = None, *, templates: bool = True) -> object:
    """What ``pickle.loads(data)`` would return, as plain values and stand-ins.

    Raises :class:`RefusedPickle`, :class:`MalformedMetadata`, or :class:`MetadataTooLarge` when
    a value named many times through the memo costs more than ``budget`` (by default, the
    budget of a file of this size); nothing else escapes. ``templates=False`` reads DCP's
    repeated records opcode by opcode too (the tests compare the two).
    """
    if budget is None:
        budget = Budget()
    budget.for_bytes(len(data))
    machine = _Machine(data, budget, templates=templates)
    try:
        return machine.run()
    except (RefusedPickle, MalformedMetadata, MetadataTooLarge):
        raise
    except RecursionError as exc:  # unreachable: nothing here recurses; kept so nothing escapes
        raise MalformedMetadata(f"nested too deeply near byte {machine.pos}") from exc
    except (ValueError, OverflowError, UnicodeDecodeError, struct.error) as exc:
        raise MalformedMetadata(f"invalid pickle near byte {machine.pos}: {exc}") from exc


class _Machine:
    def __init__(self, data: bytes, budget: Budget, *, templates: bool = True) -> None:
        self.data = data
        self.pos = 0
        # Lib/pickle.py's stacks: ``stack`` holds what was pushed since the last MARK, and MARK
        # puts it on ``metastack`` and starts an empty one, so nothing below a MARK is popped.
        self.stack: list[object] = []
        self.metastack: list[list[object]] = []
        self.globals: dict[tuple[str, str, bool], object] = {}  # admitted globals, resolved once
        # Lib/pickle.py's memo is a dict, and MEMOIZE sets memo[len(memo)]. Whatever pickle.dump
        # writes keeps it dense (MEMOIZE, or PUT of the next index below protocol 4), so it is
        # a list, appended to; a PUT past its end (a gap) makes it the dict ``far``, for good,
        # and the handlers alone read the rest.
        self.memo: list[object] = []
        self.far: dict[int, object] | None = None
        self.proto = 0
        self.result: object = UNSET
        self.budget = budget
        self.templates = _Templates() if templates else None

    def run(self) -> object:
        """Interpret up to STOP (see :meth:`read`)."""
        try:
            return self.read()
        finally:
            if self.templates is not None:
                self.templates.done()

    def read(self) -> object:
        """Interpret up to STOP.

        On a large checkpoint this loop is where ``inspect`` spends its time (about 70 opcodes
        a chunk), so the opcodes ``pickle.dump`` writes for DCP's records are interpreted here
        inline, each exactly as its handler below would, and anything else -- every other
        opcode, and any case an inline opcode does not take (a wrong type, a refusal) -- goes
        to the handler, which raises what it raises. The last bytes go through the handlers
        too: there the inline opcodes would have to check that their arguments are there.
        Where a chunk or a storage entry has been built, the ones that follow are read by
        template (``_Templates``), up to the first that is not one.
        """
        data = self.data
        end = len(data)
        safe = end - 9  # below it, every fixed-size argument (8 bytes at most) is in data
        memo = self.memo
        remember = memo.append  # MEMOIZE
        metastack = self.metastack
        stack = self.stack
        push = stack.append
        pos = self.pos
        op = 0
        # Instance() and PickledDict() without a call to __init__: they are made by the million.
        new_instance: Callable[[type[Instance]], Instance] = object.__new__
        new_dict: Callable[[type[PickledDict]], PickledDict] = object.__new__
        value: object
        try:
            while pos < safe:
                op = data[pos]
                pos += 1
                if op == 0x94:  # MEMOIZE
                    remember(stack[-1])
                elif op == 0x6A:  # LONG_BINGET
                    value = memo[index := _U32(data, pos)[0]]
                    if type(value) is Instance and value.recipe is not None:
                        value = self.recall(index)
                    push(value)
                    pos += 4
                elif op == 0x68:  # BINGET
                    value = memo[index := data[pos]]
                    if type(value) is Instance and value.recipe is not None:
                        value = self.recall(index)
                    push(value)
                    pos += 1
                elif op == 0x4B:  # BININT1
                    push(data[pos])
                    pos += 1
                elif op == 0x28:  # MARK
                    metastack.append(stack)
                    stack = []
                    push = stack.append
                elif op == 0x29:  # EMPTY_TUPLE, and NEWOBJ of an admitted record class after it
                    cls = stack[-1] if stack else None
                    if data[pos] == 0x81 and type(cls) is admitted.Global and cls.record:
                        inst = new_instance(Instance)
                        inst.cls = cls
                        inst._state = UNSET
                        inst.record = inst.recipe = None
                        stack[-1] = value = inst
                        pos += 1
                        if data[pos] == 0x94:  # MEMOIZE
                            remember(value)
                            pos += 1
                    else:
                        push(())
                elif op == 0x62:  # BUILD
                    built = stack[-2]
                    if type(built) is Instance and built._state is UNSET:
                        built._state = stack.pop()
                        # The end of a chunk or a storage entry: the next one may follow.
                        if (
                            built.cls.record in _TEMPLATED
                            and data[pos] in _REF_OPCODES
                            and self.templates is not None
                        ):
                            pos = self.templates.read(self, built.cls.record, pos, stack)
                    else:
                        self.pos, self.stack = pos, stack
                        self.build()
                elif op == 0x75:  # SETITEMS
                    if not metastack:
                        raise MalformedMetadata(f"no MARK to pop at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    target = stack[-1]
                    # A record's state: two or three fields named by strings.
                    if (
                        type(target) is PickledDict
                        and 4 <= (n := len(items)) <= 6
                        and type(items[0]) is str
                        and type(items[2]) is str
                        and (n == 4 or (n == 6 and type(items[4]) is str))
                    ):
                        pairs = target.pairs
                        pairs.append((items[0], items[1]))
                        pairs.append((items[2], items[3]))
                        if n == 6:
                            pairs.append((items[4], items[5]))
                    else:
                        self.pos = pos
                        self.set_items(target, items)
                elif op == 0x7D:  # EMPTY_DICT
                    pickled = new_dict(PickledDict)
                    pickled.pairs = []
                    push(value := pickled)
                    if data[pos] == 0x94:
                        remember(value)
                        pos += 1
                elif op == 0x52:  # REDUCE: torch.Size inline
                    args = stack[-1]
                    target = stack[-2]
                    if (
                        type(target) is admitted.Global
                        and target.reducer == "Size"
                        and type(args) is tuple
                        and len(args) == 1
                        and type(dims := args[0]) is tuple
                        and len(dims) <= _INLINE_DIMS
                        and _ints(dims)
                    ):
                        del stack[-1]
                        stack[-1] = dims
                        if data[pos] == 0x94:
                            remember(dims)
                            pos += 1
                    else:
                        self.pos, self.stack = pos, stack
                        self.reduce()
                elif op == 0x85:  # TUPLE1
                    stack[-1] = value = (stack[-1],)
                    if data[pos] == 0x94:
                        remember(value)
                        pos += 1
                elif op == 0x86:  # TUPLE2
                    second = stack.pop()
                    stack[-1] = value = (stack[-1], second)
                    if data[pos] == 0x94:
                        remember(value)
                        pos += 1
                elif op == 0x4D:  # BININT2
                    push(data[pos] | data[pos + 1] << 8)
                    pos += 2
                elif op == 0x4A:  # BININT
                    push(_I32(data, pos)[0])
                    pos += 4
                elif op == 0x8C and (stop := pos + 1 + data[pos]) < end:  # SHORT_BINUNICODE
                    # Decoded before pos moves on: a bad string is reported where its handler
                    # reports it.
                    push(value := data[pos + 1 : stop].decode("utf-8", "surrogatepass"))
                    pos = stop
                    if data[pos] == 0x94:
                        remember(value)
                        pos += 1
                elif op == 0x89:  # NEWFALSE
                    push(False)
                elif op == 0x88:  # NEWTRUE
                    push(True)
                elif op == 0x4E:  # NONE
                    push(None)
                elif op == 0x8A and (stop := pos + 1 + data[pos]) < end:  # LONG1
                    push(int.from_bytes(data[pos + 1 : stop], "little", signed=True))
                    pos = stop
                else:
                    self.pos, self.stack = pos - 1, stack
                    self.step()
                    if self.result is not UNSET:
                        return self.result
                    pos, stack = self.pos, self.stack
                    push = stack.append
                    if self.far is not None:  # a gap in the memo: the handlers read the rest
                        break
        except (ValueError, OverflowError, struct.error):  # load() says where
            self.pos = max(self.pos, pos)  # a handler's own position is past the inline one
            raise
        except IndexError:  # a memo read past its end, or a pop or a top of an empty stack
            if op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                size = 4 if op == 0x6A else 1
                index = int.from_bytes(data[pos : pos + size], "little")
                raise MalformedMetadata(f"memo entry {index} read before it was set") from None
            raise MalformedMetadata(f"stack underflow at byte {pos}") from None
        self.pos, self.stack = pos, stack
        while self.result is UNSET:
            self.step()
        return self.result

    def step(self) -> None:
        """Interpret the opcode at ``pos`` by its handler."""
        data = self.data
        if self.pos >= len(data):
            raise MalformedMetadata(
                f"the pickle ends at byte {len(data)} before its STOP opcode (truncated)"
            )
        code = data[self.pos]
        start = self.pos
        self.pos += 1
        handler = _HANDLERS.get(code)
        if handler is None:
            name = _NAMES.get(code)
            if name in _REFUSED:
                raise RefusedPickle(self._refused_opcode(name))
            raise MalformedMetadata(f"unknown opcode 0x{code:02x} at byte {start}")
        handler(self)

    def _refused_opcode(self, name: str) -> str:
        what = f"opcode {name} ({_REFUSED[name]})"
        if name == "INST":  # INST names its class inline: name it too
            try:
                module, cls = self._line().decode("utf-8"), self._line().decode("utf-8")
            except (MalformedMetadata, UnicodeDecodeError):
                return what
            module, cls = self._mapped(module, cls)
            return f"{what}: global {module}.{cls}"
        return what

    # --- reading the stream ----------------------------------------------------------------

    def _take(self, n: int) -> bytes:
        left = len(self.data) - self.pos
        if n < 0 or n > left:
            raise MalformedMetadata(
                f"an argument of {n} bytes at byte {self.pos}, where {left} are left (truncated)"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def _uint(self, size: int) -> int:
        return int.from_bytes(self._take(size), "little")

    def _line(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise MalformedMetadata(f"a line at byte {self.pos} has no end (truncated)")
        line = self.data[self.pos : end]
        self.pos = end + 1
        return line

    def _number_line(self) -> bytes:
        line = self._line()
        if len(line) > MAX_TEXT_NUMBER:
            raise MalformedMetadata(f"a text number of {len(line)} characters")
        return line

    # --- the stack -------------------------------------------------------------------------

    def pop(self) -> object:
        if not self.stack:
            raise MalformedMetadata(f"stack underflow at byte {self.pos}")
        return self.stack.pop()

    def top(self) -> object:
        if not self.stack:
            raise MalformedMetadata(f"stack underflow at byte {self.pos}")
        return self.stack[-1]

    def mark(self) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def pop_mark(self) -> list[object]:
        if not self.metastack:
            raise MalformedMetadata(f"no MARK to pop at byte {self.pos}")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, value: object) -> None:
        self.stack.append(value)

    def recall(self, index: int) -> object:
        """Memo entry ``index`` (one that is set): a record a template deferred makes the
        entries its opcodes made, if this is one of them."""
        value = self.memo[index]
        if type(value) is Instance and value.recipe is not None and index != value.base:
            value.recipe.make(value)
            value = self.memo[index]
        return value

    def make_deferred(self) -> None:
        """Make every record a template deferred: before the memo is overwritten or left."""
        for value in self.memo:
            if type(value) is Instance and value.recipe is not None:
                value.recipe.make(value)

    # --- globals and the calls they allow --------------------------------------------------

    def _mapped(self, module: str, name: str) -> tuple[str, str]:
        # Lib/pickle.py find_class: below protocol 3 Python 2 names are mapped (fix_imports).
        if self.proto < 3:
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        return module, name

    def push_global(self, module: str, name: str) -> None:
        key = (module, name, self.proto < 3)
        found = self.globals.get(key)
        if found is None:
            found = self.globals[key] = admitted.resolve(*self._mapped(module, name))
        self.push(found)

    def reduce(self) -> None:
        args = self.pop()
        target = self.pop()
        if not isinstance(target, admitted.Global):
            raise RefusedPickle(f"REDUCE of {_kind(target)}")
        # Reducing copies its arguments (torch.Size's dimensions, a path's parts), and they may
        # be one long tuple named through the memo at every REDUCE: each copy is work.
        if isinstance(args, (tuple, list)):
            inner = args[0] if target.reducer == "Size" and len(args) == 1 else args
            if isinstance(inner, (tuple, list)) and len(inner) > _INLINE_DIMS:
                self.budget.spend(len(inner), f"REDUCE of {target.dotted} near byte {self.pos}")
        self.push(admitted.reduce(target, args))

    def newobj(self, args: object, kwargs: object) -> None:
        cls = self.pop()
        if not isinstance(cls, admitted.Global) or cls.record is None:
            raise RefusedPickle(f"NEWOBJ of {_kind(cls)}")
        no_args = isinstance(args, tuple) and not args
        no_kwargs = kwargs is None or (isinstance(kwargs, PickledDict) and not kwargs.pairs)
        if not (no_args and no_kwargs):
            raise MalformedMetadata(f"NEWOBJ of {cls.dotted} with arguments (DCP passes none)")
        self.push(Instance(cls))

    def build(self) -> None:
        state = self.pop()
        inst = self.top()
        if not isinstance(inst, Instance):
            raise RefusedPickle(f"BUILD of {_kind(inst)}")
        if inst.built:
            raise MalformedMetadata(f"a second BUILD of one {inst.cls.name} (DCP builds once)")
        inst._state = state

    def set_items(self, target: object, items: list[object]) -> None:
        if not isinstance(target, PickledDict):
            raise MalformedMetadata(f"SETITEM on {_kind(target)}")
        if len(items) % 2:
            raise MalformedMetadata(f"SETITEMS with an odd number of items at byte {self.pos}")
        keys = items[::2]
        # storage_data's keys, built MetadataIndex objects, a thousand a SETITEMS: checked at
        # once, by map() at C speed.
        if not (
            set(map(type, keys)) == {Instance}
            and set(map(_RECORD_CLASS, keys)) == {"MetadataIndex"}
            and UNSET not in map(_STATE, keys)
        ):
            for key in keys:
                # A string, or a built MetadataIndex: what DCP writes.
                if type(key) is not str and not (
                    type(key) is Instance
                    and key.cls.record == "MetadataIndex"
                    and key._state is not UNSET
                ):
                    self._check_key(key)
        target.pairs.extend(zip(keys, items[1::2], strict=True))

    def _check_key(self, key: object) -> None:
        """Refuse a key Python could not hash, or could only hash by recursing into it."""
        if isinstance(key, _SIMPLE_KEYS):
            return
        if isinstance(key, tuple):
            if len(key) > _INLINE_DIMS:  # a long tuple named as a key again and again
                self.budget.spend(len(key), f"a dict key near byte {self.pos}")
            if all(isinstance(item, _SCALAR_KEYS) for item in key):
                return
        if isinstance(key, Instance) and key.cls.record == "MetadataIndex":
            if not key.built:  # torch would hash it with no fields set, and fail
                raise MalformedMetadata("a MetadataIndex used as a key before it was built")
            return
        raise MalformedMetadata(f"a dict key that is {_kind(key)}")


def _ints(values: tuple[object, ...]) -> bool:
    # A loop, not all() of a generator: a few times faster on the two dimensions of a Size.
    for value in values:  # noqa: SIM110
        if type(value) is not int:
            return False
    return True


def _kind(value: object) -> str:
    if isinstance(value, admitted.Global):
        return value.dotted
    if isinstance(value, Instance):
        return f"a {value.cls.name} object"
    if isinstance(value, records.DType):
        return f"torch.{value.name}"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


# --- templates: DCP's repeated records, each read by one match -------------------------------
#
# pickle.dump writes each chunk of a tensor and each storage entry as the same opcodes, only
# the numbers and the names changing; the class and the field names are memo references after
# their first use (Lib/pickle.py memoizes every string and global it writes). A chunk
# (torch/distributed/checkpoint/metadata.py ChunkStorageMetadata, a dataclass: NEWOBJ, then
# BUILD with its __dict__; each torch.Size by its __reduce__, (torch.Size, (tuple(self),))):
#
#   GET cls  EMPTY_TUPLE NEWOBJ MEMOIZE  EMPTY_DICT MEMOIZE MARK
#     GET 'offsets'  GET torch.Size  ints TUPLE2 MEMOIZE TUPLE1 MEMOIZE REDUCE MEMOIZE
#     GET 'sizes'    GET torch.Size  ints TUPLE2 MEMOIZE TUPLE1 MEMOIZE REDUCE MEMOIZE
#   SETITEMS BUILD
#
# and an entry of storage_data, its MetadataIndex key (metadata.py: __init__ sets fqn, index,
# then offset only when there is one) and its _StorageInfo value (filesystem.py: __getstate__
# leaves out the fields that are None):
#
#   GET cls  EMPTY_TUPLE NEWOBJ MEMOIZE  EMPTY_DICT MEMOIZE MARK
#     GET 'fqn' SHORT_BINUNICODE fqn MEMOIZE  GET 'index' int  [GET 'offset' torch.Size]
#   SETITEMS BUILD
#   GET cls  EMPTY_TUPLE NEWOBJ MEMOIZE  EMPTY_DICT MEMOIZE MARK
#     GET 'relative_path' GET path  GET 'offset' int  GET 'length' int
#   SETITEMS BUILD
#
# A million chunks are 70 million opcodes. So once the opcodes have built one of these records
# and the next begins, a regular expression of the record with its memo references written out
# (each checked once, on the memo: the class, a string for each field name, torch.Size; the
# memo is only appended to meanwhile, so they hold) matches the records that follow, each
# anchored where the last ended (each byte is matched once), and each is built as its opcodes
# would build it, memo entries included. The first record that does not match (another record,
# a FRAME, a string whose length is not the one written, a reference to an entry the record
# itself makes or that is not set) goes back to the opcodes, which read it as they read
# everything: a template only takes what the opcodes would take with no refusal, no error and
# no unit of work (a torch.Size of up to _INLINE_DIMS dimensions).
#
# Where the field names are torch's and every value passes :mod:`.metadata`'s checks, the
# template makes the record :mod:`.metadata` would make (Instance.record), and defers the rest:
# the record's Instance stands in each memo entry its opcodes made until something asks for
# one (a memo reference, a PUT over it, its ``state``), and only then are the state and those
# entries made (``_Recipe``), as the opcodes made them. A real file never asks. Equal torch.Size
# arguments share one tuple (a tuple never changes: no one can tell), and equal chunks one
# record.

_REF_OPCODES: Final = (0x68, 0x6A)  # BINGET, LONG_BINGET: how a record after the first begins
_TEMPLATED: Final = frozenset({"ChunkStorageMetadata", "_StorageInfo"})  # what one follows
_ANY_REF: Final = rb"(?:h.|j....)"
# An int as Lib/pickle.py save_long writes it: BININT1, BININT2, BININT, or LONG1 of up to 8
# bytes (an int64; longer, a value the checks refuse, left to the opcodes).
_INT: Final = (
    rb"(?:K.|M..|J....|\x8a(?:"
    + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(1, 9))
    + rb"))"
)
# The arguments of torch.Size, as save_tuple writes its tuple of dimensions (TUPLE1 to TUPLE3,
# MARK ... TUPLE past three, EMPTY_TUPLE, never memoized, for none; up to _INLINE_DIMS, as the
# inline REDUCE takes them), as a group; then TUPLE1 and REDUCE. Each int is read once.
_SIZE: Final = (
    b"("
    + (_INT + rb"(?:\x85|" + _INT + rb"(?:\x86|" + _INT + rb"\x87))\x94|")
    + (rb"\(" + _INT + rb"{4,%d}t\x94|\))\x85\x94R\x94" % _INLINE_DIMS)
)
_NEW: Final = rb"\)\x81\x94\}\x94\("  # EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT MEMOIZE MARK


class _Ref:
    """A memo reference of a template: a named group while it is learned, then its bytes."""

    def __init__(self, name: str) -> None:
        self.name = name


_Part = bytes | _Ref
_CHUNK: Final[tuple[_Part, ...]] = (
    _Ref("cls"),
    _NEW,
    _Ref("offsets"),
    _Ref("size1"),
    _SIZE,
    _Ref("sizes"),
    _Ref("size2"),
    _SIZE,
    b"ub",
)
_ENTRY: Final[tuple[_Part, ...]] = (
    _Ref("index_cls"),
    _NEW,
    _Ref("fqn"),
    # The name: a new string up to its MEMOIZE (its length is checked below: a name with a
    # 0x94 byte in it is left to the opcodes), or one named before.
    rb"(?:\x8c(.)([^\x94]{0,255})\x94|(" + _ANY_REF + b"))",
    _Ref("index"),
    rb"(" + _INT + rb"|N)",
    b"(?:",
    _Ref("offset"),
    _Ref("size"),
    _SIZE,
    b")?ub",
    _Ref("info_cls"),
    _NEW,
    _Ref("relative_path"),
    b"(" + _ANY_REF + b")",
    _Ref("start"),
    b"(" + _INT + b")",
    _Ref("length"),
    b"(" + _INT + b")",
    b"ub",
)
# torch's field names, by the references that name them: with these a template makes records.
_CHUNK_FIELDS: Final = {"offsets": "offsets", "sizes": "sizes"}
_ENTRY_FIELDS: Final = {
    "fqn": "fqn",
    "index": "index",
    "relative_path": "relative_path",
    "start": "offset",
    "length": "length",
}
# Compiled templates, by their memo references: a real file makes one for its chunks and one or
# two for its entries; a file may make a few more, never many.
_COMPILED: Final[dict[tuple[object, ...], re.Pattern[bytes]]] = {}
_COMPILED_LOCK: Final = threading.Lock()
_MAX_COMPILED: Final = 64
_MAX_COMPILES_A_FILE: Final = 8
_MAX_CACHED: Final = 1 << 16  # decoded torch.Size arguments and chunk records kept, each


def _learner(parts: tuple[_Part, ...]) -> re.Pattern[bytes]:
    """The template with each memo reference a named group, to learn them from one record:
    compiled once, when a file first has one (compiling takes longer than a small file)."""
    pattern = _COMPILED.get((parts,))
    if pattern is None:
        pattern = _COMPILED[(parts,)] = re.compile(
            b"".join(
                b"(?P<%s>%s)" % (part.name.encode(), _ANY_REF) if isinstance(part, _Ref) else part
                for part in parts
            ),
            re.DOTALL,
        )
    return pattern


def _memo_index(ref: bytes) -> int:
    return ref[1] if ref[0] == 0x68 else int(_U32(ref, 1)[0])


def _decode_int(raw: bytes) -> int:
    """An int opcode matched by _INT, as it pushes its value."""
    op = raw[0]
    if op == 0x4A:  # BININT: a signed int32
        value: int = _I32(raw, 1)[0]
        return value
    if op == 0x4B:  # BININT1
        return raw[1]
    if op == 0x4D:  # BININT2
        return raw[1] | raw[2] << 8
    return int.from_bytes(raw[2:], "little", signed=True)  # LONG1: its length, then the int


_Size = tuple[tuple[int, ...], tuple[object, ...], bool]


def _decode_size(raw: bytes) -> _Size:
    """A matched torch.Size: its dimensions, as its int opcodes push them; the memo entries
    its opcodes make (the tuple TUPLE2 makes, the 1-tuple REDUCE is given, and what REDUCE
    gives back, the same tuple; EMPTY_TUPLE is not memoized); and whether every dimension is
    one torch holds (0 to 2**63 - 1). A tuple is never changed: the equal torch.Size
    arguments of a file can share these."""
    values: list[int] = []
    i = 1 if raw[0] == 0x28 else 0  # MARK
    while raw[i] in b"KMJ\x8a":  # an int, up to the TUPLE opcode
        n = 1 if raw[i] == 0x4B else 2 if raw[i] == 0x4D else 4 if raw[i] == 0x4A else raw[i + 1]
        size = n + (2 if raw[i] == 0x8A else 1)
        values.append(_decode_int(raw[i : i + size]))
        i += size
    dims = tuple(values)
    made = (dims, (dims,), dims) if dims else ((dims,), dims)
    return dims, made, all(0 <= d <= records.INT64_MAX for d in dims)


def _is_record(value: object, record: str) -> TypeGuard[admitted.Global]:
    return type(value) is admitted.Global and value.record == record


def _is_size(value: object) -> bool:
    return type(value) is admitted.Global and value.reducer == "Size"


def _fields_match(named: dict[str, object], fields: dict[str, str]) -> bool:
    return all(named.get(ref) == name for ref, name in fields.items())


def _size_entries(value: tuple[int, ...]) -> tuple[object, ...]:
    # The memo entries of a torch.Size's opcodes, as _decode_size gives them.
    return (value, (value,), value) if value else ((value,), value)


class _Recipe:
    """How to make the state of a record a template deferred, and the memo entries its
    opcodes made (the record's Instance holds them all until then), from its ``record``:
    the keys are the run's, the values the record's."""

    __slots__ = ("keys", "kind", "memo")

    def __init__(self, kind: str, keys: tuple[object, ...], memo: list[object]) -> None:
        self.kind = kind  # "chunk", "key" (a name it read as a string), "key named", "info"
        self.keys = keys
        self.memo: list[object] | None = memo  # None once the file is read

    def make(self, inst: Instance) -> None:
        keys, record = self.keys, inst.record
        state = PickledDict()
        if self.kind == "chunk":
            chunk = cast(records.ChunkStorageMetadata, record)
            state.pairs = [(keys[0], chunk.offsets), (keys[1], chunk.sizes)]
            made = (inst, state, *_size_entries(chunk.offsets), *_size_entries(chunk.sizes))
        elif self.kind == "info":
            row = cast(records.StorageRow, record)
            state.pairs = [(keys[0], row[3]), (keys[1], row[4]), (keys[2], row[5])]
            made = (inst, state)
        else:
            row = cast(records.StorageRow, record)
            state.pairs = [(keys[0], row[0]), (keys[1], row[2])]
            made = (inst, state, row[0]) if self.kind == "key" else (inst, state)
            if row[1] is not None:
                state.pairs.append((keys[2], row[1]))
                made += _size_entries(row[1])
        inst._state = state
        inst.record = inst.recipe = None  # its state may change from here
        memo = self.memo
        if memo is not None:
            for at, value in enumerate(made, inst.base):
                if memo[at] is inst:  # not overwritten by a PUT since
                    memo[at] = value


class _Templates:
    """The records of one file read by template (see above)."""

    def __init__(self) -> None:
        self.sizes: dict[bytes, _Size] = {}  # by the bytes of their arguments
        # A name and a length are one object for each of their values, as a torch.Size is:
        # the same tensor's name is in each rank's entries, a shard's length in many.
        self.names: dict[bytes, str] = {}
        self.lengths: dict[bytes, int] = {}
        # By the arguments of their two torch.Size: the record, and the memo entries made.
        self.chunks_made: dict[tuple[bytes, ...], tuple[records.ChunkStorageMetadata | None, int]]
        self.chunks_made = {}
        self.compiles_left = _MAX_COMPILES_A_FILE
        self.recipes: list[_Recipe] = []

    def read(self, m: _Machine, record: str | None, pos: int, stack: list[object]) -> int:
        """Read the records that follow a ``record`` the opcodes just built, from ``pos``
        onto ``stack``: where the opcodes take over."""
        if record == "ChunkStorageMetadata":
            return self.chunks(m, pos, stack)
        return self.entries(m, pos, stack)

    def done(self) -> None:
        """The file is read: what is left deferred is made without the memo."""
        for recipe in self.recipes:
            recipe.memo = None

    def recipe(self, kind: str, keys: tuple[object, ...], memo: list[object]) -> _Recipe:
        recipe = _Recipe(kind, keys, memo)
        self.recipes.append(recipe)
        return recipe

    def learn(
        self, m: _Machine, learner: re.Pattern[bytes], pos: int
    ) -> tuple[re.Match[bytes], dict[str, object]] | None:
        """The memo references of the record at ``pos`` and what they name, if it is one."""
        found = learner.match(m.data, pos)
        if found is None:
            return None
        named: dict[str, object] = {}
        for name, ref in found.groupdict().items():
            if isinstance(ref, bytes):  # None: a reference the record leaves out
                index = _memo_index(ref)
                # An entry made before this record, which the records that follow cannot
                # change: they only append to the memo.
                if index >= len(m.memo):
                    return None
                named[name] = m.recall(index)
        return found, named

    def compiled(
        self, parts: tuple[_Part, ...], found: re.Match[bytes]
    ) -> re.Pattern[bytes] | None:
        """The template with the memo references of ``found`` written out; None past the
        compilations a file may cause."""
        refs = tuple(found.group(part.name) if isinstance(part, _Ref) else None for part in parts)
        key = (parts, *refs)
        pattern = _COMPILED.get(key)
        if pattern is None:
            if self.compiles_left <= 0:
                return None
            self.compiles_left -= 1
            pattern = re.compile(
                b"".join(
                    part
                    if not isinstance(part, _Ref)
                    else re.escape(ref)
                    if isinstance(ref, bytes)
                    else b"(?!)"  # a reference the learned record left out: never matched
                    for part, ref in zip(parts, refs, strict=True)
                ),
                re.DOTALL,
            )
            # One cache for every thread a caller reads files in: evicted and added under a lock,
            # so two evictions never race for one key (a KeyError would escape load()).
            with _COMPILED_LOCK:
                while len(_COMPILED) >= _MAX_COMPILED:  # the oldest go (a learner is recompiled)
                    del _COMPILED[next(iter(_COMPILED))]
                _COMPILED[key] = pattern
        return pattern

    def size(self, raw: bytes) -> _Size:
        decoded = self.sizes.get(raw)
        if decoded is None:
            decoded = _decode_size(raw)
            if len(self.sizes) < _MAX_CACHED:
                self.sizes[raw] = decoded
        return decoded

    def chunks(self, m: _Machine, pos: int, stack: list[object]) -> int:
        learned = self.learn(m, _learner(_CHUNK), pos)
        if learned is None:
            return pos
        found, named = learned
        cls, offsets, sizes = named["cls"], named["offsets"], named["sizes"]
        if not (
            _is_record(cls, "ChunkStorageMetadata")
            and type(offsets) is str  # keys SETITEMS takes as they are
            and type(sizes) is str
            and _is_size(named["size1"])
            and _is_size(named["size2"])
        ):
            return pos
        pattern = self.compiled(_CHUNK, found)
        if pattern is None:
            return pos
        memo = m.memo
        # torch's field names: the record :mod:`.metadata` makes of it is known here.
        recipe = (
            self.recipe("chunk", (offsets, sizes), memo)
            if _fields_match(named, _CHUNK_FIELDS)
            else None
        )
        made = self.chunks_made if recipe is not None else {}
        new_instance: Callable[[type[Instance]], Instance] = object.__new__
        data, match_at = m.data, pattern.match
        while (match := match_at(data, pos)) is not None:
            inst = new_instance(Instance)
            inst.cls = cls
            # The record of the arguments of its two torch.Size and the memo entries its
            # opcodes make, once for each: the chunks of a checkpoint repeat.
            raws: tuple[bytes, ...] = match.groups()
            known = made.get(raws)
            if known is None:
                known = self.chunk_record(raws, recipe is not None)
                if known[0] is not None and len(made) < _MAX_CACHED:
                    made[raws] = known
            record, entries = known
            if record is not None:
                # Deferred: the record, and the Instance for each memo entry it made.
                inst._state = _DEFERRED
                inst.record = record
                inst.recipe = recipe
                inst.base = len(memo)
                memo += (inst,) * entries
            else:
                offsets_value, memo1, _ = self.size(raws[0])
                sizes_value, memo2, _ = self.size(raws[1])
                state = PickledDict([(offsets, offsets_value), (sizes, sizes_value)])
                inst._state = state
                inst.record = inst.recipe = None
                memo += (inst, state)
                memo += memo1
                memo += memo2
            stack.append(inst)
            pos = match.end()
        return pos

    def chunk_record(
        self, raws: tuple[bytes, ...], making: bool
    ) -> tuple[records.ChunkStorageMetadata | None, int]:
        """The record of a chunk whose torch.Size arguments are ``raws``, if the template
        ``making`` it has torch's field names and every value is one torch holds; and how many
        memo entries its opcodes make."""
        offsets_value, memo1, valid1 = self.size(raws[0])
        sizes_value, memo2, valid2 = self.size(raws[1])
        entries = 2 + len(memo1) + len(memo2)
        if making and valid1 and valid2:
            return records.ChunkStorageMetadata(offsets_value, sizes_value), entries
        return None, entries

    def entries(self, m: _Machine, pos: int, stack: list[object]) -> int:
        learned = self.learn(m, _learner(_ENTRY), pos)
        if learned is None:
            return pos
        found, named = learned
        index_cls, info_cls = named["index_cls"], named["info_cls"]
        fqn_key, index_key, offset_key = named["fqn"], named["index"], named.get("offset")
        path_key, start_key, length_key = named["relative_path"], named["start"], named["length"]
        if not (
            _is_record(index_cls, "MetadataIndex")
            and _is_record(info_cls, "_StorageInfo")
            and all(type(key) is str for key in (fqn_key, index_key, path_key, start_key))
            and type(length_key) is str
            and (offset_key is None or (type(offset_key) is str and _is_size(named["size"])))
        ):
            return pos
        pattern = self.compiled(_ENTRY, found)
        if pattern is None:
            return pos
        memo = m.memo
        key_recipe = key_named_recipe = info_recipe = None
        if _fields_match(named, _ENTRY_FIELDS) and offset_key in (None, "offset"):
            keys = (fqn_key, index_key, offset_key)
            key_recipe = self.recipe("key", keys, memo)
            key_named_recipe = self.recipe("key named", keys, memo)
            info_recipe = self.recipe("info", (path_key, start_key, length_key), memo)
        cached, size, top = self.sizes, self.size, records.INT64_MAX
        names, lengths = self.names, self.lengths
        first = len(memo)
        paths: dict[bytes, object] = {}  # the references to a path set before these records
        new_instance: Callable[[type[Instance]], Instance] = object.__new__
        data, match_at = m.data, pattern.match
        while (match := match_at(data, pos)) is not None:
            length, name, name_ref, index, offset, path_ref, start_raw, length_raw = match.groups()
            # What the record reads before making anything: a reference to an entry this
            # record makes (or one not set) is left to the opcodes, as a string that does not
            # end where its length says, or that is not UTF-8 (the opcodes say where).
            here = len(memo)
            path = paths.get(path_ref, UNSET)
            if path is UNSET:
                at = path_ref[1] if path_ref[0] == 0x68 else _U32(path_ref, 1)[0]
                if at >= here:
                    break
                path = m.recall(at)
                if at < first:
                    paths[path_ref] = path
            fqn: object
            if name is None:
                at = name_ref[1] if name_ref[0] == 0x68 else _U32(name_ref, 1)[0]
                if at >= here:
                    break
                fqn = m.recall(at)
            elif len(name) != length[0]:
                break
            elif (fqn := names.get(name)) is None:
                try:
                    fqn = name.decode("utf-8", "surrogatepass")
                except UnicodeDecodeError:
                    break
                if len(names) < _MAX_CACHED:
                    names[name] = fqn
            # The ints, as _decode_int reads them, the common ones inline: a chunk index as
            # BININT1, an offset and a length in a file as BININT (or BININT2 and LONG1).
            hint = None if index == b"N" else index[1] if index[0] == 0x4B else _decode_int(index)
            start = _I32(start_raw, 1)[0] if start_raw[0] == 0x4A else _decode_int(start_raw)
            length_value = lengths.get(length_raw)
            if length_value is None:
                length_value = _decode_int(length_raw)
                if len(lengths) < _MAX_CACHED:
                    lengths[length_raw] = length_value
            value: tuple[int, ...] | None = None
            memo_value: tuple[object, ...] = ()
            valid = True
            if offset is not None:
                value, memo_value, valid = cached.get(offset) or size(offset)
            key = new_instance(Instance)
            key.cls = index_cls
            info = new_instance(Instance)
            info.cls = info_cls
            if (
                info_recipe is not None
                and valid
                and type(fqn) is str
                and type(path) is str
                and 0 <= start <= top
                and 0 <= length_value <= top
            ):
                # Deferred: the entry as records.StorageData keeps it, shared by the key and
                # the value, and each Instance for each memo entry it made.
                key.record = info.record = (fqn, value, hint, path, start, length_value, None)
                key._state = info._state = _DEFERRED
                info.recipe = info_recipe
                key.base = here
                if name is None:
                    key.recipe = key_named_recipe
                    info.base = here + 2 + len(memo_value)
                else:
                    key.recipe = key_recipe
                    info.base = here + 3 + len(memo_value)
                memo += (key,) * (info.base - here)
                memo += (info, info)
            else:
                key_state = PickledDict([(fqn_key, fqn), (index_key, hint)])
                if value is not None:
                    key_state.pairs.append((offset_key, value))
                info_state = PickledDict(
                    [(path_key, path), (start_key, start), (length_key, length_value)]
                )
                key._state, info._state = key_state, info_state
                key.record = key.recipe = info.record = info.recipe = None
                memo += (key, key_state) if name is None else (key, key_state, fqn)
                memo += memo_value
                memo += (info, info_state)
            stack += (key, info)
            pos = match.end()
        return pos


# --- one handler per opcode --------------------------------------------------------------

_Handler = Callable[[_Machine], None]


def _proto(m: _Machine) -> None:
    proto = m._uint(1)
    if proto > HIGHEST_PROTOCOL:
        raise MalformedMetadata(f"unsupported pickle protocol {proto}")
    m.proto = proto


def _frame(m: _Machine) -> None:
    size = m._uint(8)
    if size > len(m.data) - m.pos:  # the C unpickler reads the frame whole: it would be short
        raise MalformedMetadata(f"a frame of {size} bytes at byte {m.pos} (truncated)")


def _stop(m: _Machine) -> None:
    m.result = m.pop()


def _int(m: _Machine) -> None:
    line = m._number_line()
    if line == b"00":
        m.push(False)
    elif line == b"01":
        m.push(True)
    else:
        m.push(int(line, 0))


def _long(m: _Machine) -> None:
    line = m._number_line()
    m.push(int(line[:-1] if line.endswith(b"L") else line, 0))


def _long_n(size: int) -> _Handler:
    # LONG1's length is one unsigned byte, LONG4's a signed int4 (negative: refused by _take).
    def handler(m: _Machine) -> None:
        n = int.from_bytes(m._take(size), "little", signed=size == 4)
        m.push(int.from_bytes(m._take(n), "little", signed=True))

    return handler


def _ascii(raw: bytes) -> str:
    # Lib/pickle.py decodes Python 2 strings with encoding="ASCII", errors="strict" by default.
    return raw.decode("ascii")


def _string(m: _Machine) -> None:
    line = m._line()
    if len(line) < 2 or line[0] != line[-1] or line[0] not in b"\"'":
        raise MalformedMetadata("the STRING opcode argument must be quoted")
    m.push(_ascii(codecs.escape_decode(line[1:-1])[0]))


def _sized(size: int, signed: bool, make: Callable[[bytes], object]) -> _Handler:
    def handler(m: _Machine) -> None:
        n = int.from_bytes(m._take(size), "little", signed=signed)
        m.push(make(m._take(n)))

    return handler


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def _short_binunicode(m: _Machine) -> None:
    # The opcode of nearly every string DCP writes: read inline, as it dominates the time.
    data, pos = m.data, m.pos
    if pos >= len(data) or pos + 1 + data[pos] > len(data):
        m.push(_utf8(m._take(m._uint(1))))  # past the end: _take says so
        return
    end = pos + 1 + data[pos]
    m.stack.append(data[pos + 1 : end].decode("utf-8", "surrogatepass"))
    m.pos = end


def _unicode(m: _Machine) -> None:
    m.push(m._line().decode("raw-unicode-escape"))


def _float(m: _Machine) -> None:
    m.push(float(m._number_line()))


def _binfloat(m: _Machine) -> None:
    m.push(struct.unpack(">d", m._take(8))[0])


def _constant(value: object) -> _Handler:
    return lambda m: m.push(value)


def _empty(factory: Callable[[], object]) -> _Handler:
    return lambda m: m.push(factory())


def _tuple_n(n: int) -> _Handler:
    def handler(m: _Machine) -> None:
        items = [m.pop() for _ in range(n)]
        m.push(tuple(reversed(items)))

    return handler


def _tuple(m: _Machine) -> None:
    m.push(tuple(m.pop_mark()))


def _list(m: _Machine) -> None:
    m.push(m.pop_mark())


def _dict(m: _Machine) -> None:
    items = m.pop_mark()
    target = PickledDict()
    m.set_items(target, items)
    m.push(target)


def _append(m: _Machine) -> None:
    value = m.pop()
    target = m.top()
    if not isinstance(target, list):
        raise MalformedMetadata(f"APPEND to {_kind(target)}")
    target.append(value)


def _appends(m: _Machine) -> None:
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, list):
        raise MalformedMetadata(f"APPENDS to {_kind(target)}")
    target.extend(items)


def _setitem(m: _Machine) -> None:
    value = m.pop()
    key = m.pop()
    m.set_items(m.top(), [key, value])


def _setitems(m: _Machine) -> None:
    items = m.pop_mark()
    m.set_items(m.top(), items)


def _mark(m: _Machine) -> None:
    m.mark()


def _pop(m: _Machine) -> None:
    # Lib/pickle.py load_pop: an empty stack above the last MARK pops the MARK instead.
    if m.stack:
        m.stack.pop()
    else:
        m.pop_mark()


def _pop_mark(m: _Machine) -> None:
    m.pop_mark()


def _dup(m: _Machine) -> None:
    m.push(m.top())


def _get(index: int, m: _Machine) -> None:
    if m.far is not None:
        if index not in m.far:
            raise MalformedMetadata(f"memo entry {index} read before it was set")
        m.push(m.far[index])
    elif not 0 <= index < len(m.memo):  # GET's text may say -1
        raise MalformedMetadata(f"memo entry {index} read before it was set")
    else:
        m.push(m.recall(index))


def _put(index: int, m: _Machine) -> None:
    if index < 0:
        raise MalformedMetadata("a negative memo index")
    value = m.top()
    if m.far is not None:
        m.far[index] = value
    elif index < len(m.memo):
        old = m.memo[index]
        if type(old) is Instance and old.recipe is not None:  # its entries first
            old.recipe.make(old)
        m.memo[index] = value
    elif index == len(m.memo):
        m.memo.append(value)
    else:  # a gap: from here on the memo is a dict, as Lib/pickle.py's
        m.make_deferred()
        m.far = dict(enumerate(m.memo))
        m.far[index] = value
        m.memo = []


def _memoize(m: _Machine) -> None:
    value = m.top()
    if m.far is not None:
        m.far[len(m.far)] = value
    else:
        m.memo.append(value)


def _global(m: _Machine) -> None:
    module = m._line().decode("utf-8")
    name = m._line().decode("utf-8")
    m.push_global(module, name)


def _stack_global(m: _Machine) -> None:
    name = m.pop()
    module = m.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise MalformedMetadata("STACK_GLOBAL of values that are not strings")
    m.push_global(module, name)


def _newobj(m: _Machine) -> None:
    args = m.pop()
    m.newobj(args, None)


def _newobj_ex(m: _Machine) -> None:
    kwargs = m.pop()
    args = m.pop()
    m.newobj(args, kwargs)


_BY_NAME: Final[dict[str, _Handler]] = {
    "PROTO": _proto,
    "FRAME": _frame,
    "STOP": _stop,
    "INT": _int,
    "BININT": lambda m: m.push(int.from_bytes(m._take(4), "little", signed=True)),
    "BININT1": lambda m: m.push(m._uint(1)),
    "BININT2": lambda m: m.push(m._uint(2)),
    "LONG": _long,
    "LONG1": _long_n(1),
    "LONG4": _long_n(4),
    "STRING": _string,
    "BINSTRING": _sized(4, True, _ascii),
    "SHORT_BINSTRING": _sized(1, False, _ascii),
    "BINBYTES": _sized(4, False, bytes),
    "SHORT_BINBYTES": _sized(1, False, bytes),
    "BINBYTES8": _sized(8, False, bytes),
    "NONE": _constant(None),
    "NEWTRUE": _constant(True),
    "NEWFALSE": _constant(False),
    "UNICODE": _unicode,
    "SHORT_BINUNICODE": _short_binunicode,
    "BINUNICODE": _sized(4, False, _utf8),
    "BINUNICODE8": _sized(8, False, _utf8),
    "FLOAT": _float,
    "BINFLOAT": _binfloat,
    "EMPTY_LIST": _empty(list),
    "APPEND": _append,
    "APPENDS": _appends,
    "LIST": _list,
    "EMPTY_TUPLE": _constant(()),
    "TUPLE": _tuple,
    "TUPLE1": _tuple_n(1),
    "TUPLE2": _tuple_n(2),
    "TUPLE3": _tuple_n(3),
    "EMPTY_DICT": _empty(PickledDict),
    "DICT": _dict,
    "SETITEM": _setitem,
    "SETITEMS": _setitems,
    "POP": _pop,
    "DUP": _dup,
    "MARK": _mark,
    "POP_MARK": _pop_mark,
    "GET": lambda m: _get(int(m._number_line()), m),
    "BINGET": lambda m: _get(m._uint(1), m),
    "LONG_BINGET": lambda m: _get(m._uint(4), m),
    "PUT": lambda m: _put(int(m._number_line()), m),
    "BINPUT": lambda m: _put(m._uint(1), m),
    "LONG_BINPUT": lambda m: _put(m._uint(4), m),
    "MEMOIZE": _memoize,
    "GLOBAL": _global,
    "STACK_GLOBAL": _stack_global,
    "REDUCE": lambda m: m.reduce(),
    "BUILD": lambda m: m.build(),
    "NEWOBJ": _newobj,
    "NEWOBJ_EX": _newobj_ex,
}
_HANDLERS: Final[dict[int, _Handler]] = {
    code: _BY_NAME[name] for code, name in _NAMES.items() if name in _BY_NAME
}
