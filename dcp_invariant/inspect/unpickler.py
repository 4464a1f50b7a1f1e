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
"""

from __future__ import annotations

import _compat_pickle
import codecs
import pickletools
import struct
from collections.abc import Callable
from typing import Final

from dcp_invariant.inspect import admitted, records
from dcp_invariant.inspect.budget import Budget
from dcp_invariant.inspect.errors import MalformedMetadata, MetadataTooLarge, RefusedPickle

HIGHEST_PROTOCOL: Final = 5
# A text integer (protocol 0's INT, LONG, GET, PUT) longer than this is refused unconverted.
MAX_TEXT_NUMBER: Final = 64
# A tuple up to this long is checked where it is used; a longer one costs its length in work
# (:mod:`.budget`) each time, as a memo reference can name it again for two bytes.
_INLINE_DIMS: Final = 8
_U32: Final = struct.Struct("<I").unpack_from
_I32: Final = struct.Struct("<i").unpack_from
UNSET: Final = object()


class Instance:
    """An admitted record class after NEWOBJ: ``state`` is what BUILD gave it, once."""

    __slots__ = ("cls", "state")

    def __init__(self, cls: admitted.Global, state: object = UNSET) -> None:
        self.cls = cls
        self.state = state

    @property
    def built(self) -> bool:
        return self.state is not UNSET


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


def load(data: bytes, budget: Budget | None = None) -> object:
    """What ``pickle.loads(data)`` would return, as plain values and stand-ins.

    Raises :class:`RefusedPickle`, :class:`MalformedMetadata`, or :class:`MetadataTooLarge` when
    a value named many times through the memo costs more than ``budget`` (by default, the
    budget of a file of this size); nothing else escapes.
    """
    if budget is None:
        budget = Budget()
    budget.for_bytes(len(data))
    machine = _Machine(data, budget)
    try:
        return machine.run()
    except (RefusedPickle, MalformedMetadata, MetadataTooLarge):
        raise
    except RecursionError as exc:  # unreachable: nothing here recurses; kept so nothing escapes
        raise MalformedMetadata(f"nested too deeply near byte {machine.pos}") from exc
    except (ValueError, OverflowError, UnicodeDecodeError, struct.error) as exc:
        raise MalformedMetadata(f"invalid pickle near byte {machine.pos}: {exc}") from exc


class _Machine:
    def __init__(self, data: bytes, budget: Budget) -> None:
        self.data = data
        self.pos = 0
        # Lib/pickle.py's stacks: ``stack`` holds what was pushed since the last MARK, and MARK
        # puts it on ``metastack`` and starts an empty one, so nothing below a MARK is popped.
        self.stack: list[object] = []
        self.metastack: list[list[object]] = []
        self.globals: dict[tuple[str, str, bool], object] = {}  # admitted globals, resolved once
        self.memo: dict[int, object] = {}
        self.proto = 0
        self.result: object = UNSET
        self.budget = budget

    def run(self) -> object:
        """Interpret up to STOP.

        On a large checkpoint this loop is where ``inspect`` spends its time (about 70 opcodes
        a chunk), so the opcodes ``pickle.dump`` writes for DCP's records are interpreted here
        inline, each exactly as its handler below would, and anything else -- every other
        opcode, and any case an inline opcode does not take (a wrong type, a refusal) -- goes
        to the handler, which raises what it raises. The last bytes go through the handlers
        too: there the inline opcodes would have to check that their arguments are there.
        """
        data = self.data
        end = len(data)
        safe = end - 9  # below it, every fixed-size argument (8 bytes at most) is in data
        memo = self.memo
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
                    memo[len(memo)] = stack[-1]
                elif op == 0x6A:  # LONG_BINGET
                    push(memo[_U32(data, pos)[0]])
                    pos += 4
                elif op == 0x68:  # BINGET
                    push(memo[data[pos]])
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
                        inst.state = UNSET
                        stack[-1] = value = inst
                        pos += 1
                        if data[pos] == 0x94:  # MEMOIZE
                            memo[len(memo)] = value
                            pos += 1
                    else:
                        push(())
                elif op == 0x62:  # BUILD
                    built = stack[-2]
                    if type(built) is Instance and built.state is UNSET:
                        built.state = stack.pop()
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
                        memo[len(memo)] = value
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
                            memo[len(memo)] = dims
                            pos += 1
                    else:
                        self.pos, self.stack = pos, stack
                        self.reduce()
                elif op == 0x85:  # TUPLE1
                    stack[-1] = value = (stack[-1],)
                    if data[pos] == 0x94:
                        memo[len(memo)] = value
                        pos += 1
                elif op == 0x86:  # TUPLE2
                    second = stack.pop()
                    stack[-1] = value = (stack[-1], second)
                    if data[pos] == 0x94:
                        memo[len(memo)] = value
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
                        memo[len(memo)] = value
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
        except (ValueError, OverflowError, struct.error):  # load() says where
            self.pos = max(self.pos, pos)  # a handler's own position is past the inline one
            raise
        except IndexError:  # only a pop or a top of an empty stack raises it above
            raise MalformedMetadata(f"stack underflow at byte {pos}") from None
        except KeyError:  # only a memo read raises it above
            size = 4 if op == 0x6A else 1
            index = int.from_bytes(data[pos : pos + size], "little")
            raise MalformedMetadata(f"memo entry {index} read before it was set") from None
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
        inst.state = state

    def set_items(self, target: object, items: list[object]) -> None:
        if not isinstance(target, PickledDict):
            raise MalformedMetadata(f"SETITEM on {_kind(target)}")
        if len(items) % 2:
            raise MalformedMetadata(f"SETITEMS with an odd number of items at byte {self.pos}")
        keys = items[::2]
        for key in keys:
            if type(key) is not str:
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
    if index not in m.memo:
        raise MalformedMetadata(f"memo entry {index} read before it was set")
    m.push(m.memo[index])


def _put(index: int, m: _Machine) -> None:
    if index < 0:
        raise MalformedMetadata("a negative memo index")
    m.memo[index] = m.top()


def _memoize(m: _Machine) -> None:
    m.memo[len(m.memo)] = m.top()


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
