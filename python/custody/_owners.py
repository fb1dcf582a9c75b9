"""Owner scopes that follow Python's context (contextvars), and the owner custody's library holds
for each thread, kept in step with it.

The owner of what a piece of code allocates is the innermost open custody.owner() scope of its
context. Each thread starts with an empty context; each asyncio task runs in a copy of its
creator's; a generator runs in the context of whoever resumes it. A scope is closed for every
context once left, wherever it is left (a generator resumed and finished on another thread), so no
thread stays inside a scope that was left.

The library charges an allocation to the owner it holds for the allocating thread (PyTorch calls it
with no Python running). custody sets it from the context when a scope is entered or left and
before each of its own allocations (sync()): PyTorch's allocations are charged to the owner of the
last of those on the thread. The context is the one source of truth: Library.owner_push and
owner_pop open and close scopes of it too (push(), pop()), for code that cannot use a `with` block.
"""

import contextvars
import threading

__all__ = ["UNTAGGED", "Scope", "current", "enter", "leave", "push", "pop", "sync"]

UNTAGGED = "<untagged>"


class Scope:
    """One entered owner scope: its full name, the scope it is inside, and whether it is still open."""

    __slots__ = ("path", "parent", "open")

    def __init__(self, path, parent):
        self.path = path
        self.parent = parent
        self.open = True


_innermost = contextvars.ContextVar("custody_owner", default=None)
_pushed = contextvars.ContextVar("custody_owner_pushed", default=())  # scopes push() opened, innermost last
_held = threading.local()  # per thread: {library path: (pushes, owner)} the library holds for it


def _open(scope):
    while scope is not None and not scope.open:
        scope = scope.parent
    return scope


def current():
    """The owner of this context: the innermost open scope's full name, or None outside every scope."""
    scope = _open(_innermost.get())
    return scope.path if scope is not None else None


def enter(name):
    """Opens a scope named `name` inside this context's innermost open one ("decode" then
    "kv_cache" is "decode/kv_cache"; "" adds nothing) and returns it."""
    parent = _open(_innermost.get())
    base = parent.path if parent is not None else None
    path = (base + "/" + name if name else base) if base else (name or None)
    scope = Scope(path, parent)
    _innermost.set(scope)
    return scope


def leave(scope):
    """Closes `scope`, for every context. In this context the innermost open scope becomes the
    current one again (scopes left out of order, as interleaved generators leave them, included)."""
    scope.open = False
    innermost = _innermost.get()
    if innermost is not None and not innermost.open:
        _innermost.set(_open(innermost))


def push(name):
    """Opens a scope as enter() does, to be closed by pop() rather than by leaving a block."""
    scope = enter(name)
    _pushed.set(_pushed.get() + (scope,))
    return scope


def pop():
    """Closes the innermost scope push() opened in this context (and still open); False when there
    is none."""
    pushed = tuple(s for s in _pushed.get() if s.open)
    if not pushed:
        _pushed.set(())
        return False
    _pushed.set(pushed[:-1])
    leave(pushed[-1])
    return True


def sync(lib):
    """Makes the owner `lib` holds for this thread this context's owner: nothing when it is
    already, else a pop of what custody pushed for this thread and a push of the owner."""
    owner = current()
    held = getattr(_held, "by_library", None)
    if held is None:
        held = _held.by_library = {}
    pushes, holding = held.get(lib.path, (0, None))
    if holding == owner and pushes == (owner is not None):
        return
    for _ in range(pushes):
        lib._owner_pop_raw()
    held[lib.path] = (0, None)
    if owner is not None:
        lib._owner_push_raw(owner)
        held[lib.path] = (1, owner)
