"""nsadiag's hooks on a user's modules stay out of every copy of them.

torch keeps a module's hooks in its ``__dict__``, so ``torch.save(model)``, ``pickle`` and
``copy.deepcopy`` copy them with the module: a pickle then fails on nsadiag's hooks (they
are closures: a PicklingError, a crash nsadiag caused), and a deep copy (an EMA or teacher
model) would be counted as the watched model's blocks. ``keep_out_of_copies(module,
handles)`` gives the module an instance ``__getstate__`` (it is found before the class's)
that returns the class's state without the hooks those handles name: the copy is the
module as it is without nsadiag, loadable where nsadiag is not installed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
              "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
"""The attributes of a torch module that hold forward hooks (or facts about them) by id."""


class _StateWithoutHooks:
    """A module's ``__getstate__``: its class's, less the hook ids in ``ids``."""

    def __init__(self, module: Any):
        self.module = module
        self.ids: set[int] = set()

    def __call__(self) -> Any:
        state = type(self.module).__getstate__(self.module)
        if not isinstance(state, dict):  # a module that pickles another way: left as it is
            return state
        state = dict(state)
        state.pop("__getstate__", None)
        for name in HOOK_DICTS:
            hooks = state.get(name)
            if isinstance(hooks, dict) and self.ids.intersection(hooks):
                state[name] = OrderedDict((key, value) for key, value in hooks.items()
                                          if key not in self.ids)
        return state


def keep_out_of_copies(module: Any, handles: Iterable[Any]) -> None:
    """Leave the hooks of ``handles`` (torch RemovableHandles) out of every copy of
    ``module`` (see the module docstring)."""
    getstate = module.__dict__.get("__getstate__")
    if not isinstance(getstate, _StateWithoutHooks):
        getstate = _StateWithoutHooks(module)
        object.__setattr__(module, "__getstate__", getstate)
    getstate.ids.update(handle.id for handle in handles)
