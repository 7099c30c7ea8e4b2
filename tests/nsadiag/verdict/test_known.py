"""Exceptions whose cause is known and how a child's traceback is read
(nsadiag.verdict.known): the innermost frame of the user's project, memory exhaustion by
type, flag or message, and DDP's "marked as ready twice" explained with its parameter."""

import pytest

from nsadiag.finding.known_fixes import fixes_for
from nsadiag.verdict.known import explain_exception, is_oom_exception, project_frame

TRACEBACK = """Traceback (most recent call last):
  File "/home/user/project/nsadiag/harness/child.py", line 40, in run
    run_steps(target)
  File "/home/user/project/train.py", line 88, in run_steps
    loss = model(batch)
  File "/home/user/project/model.py", line 57, in forward
    y = self.attend(x)
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1784, in _call_impl
    return forward_call(*args, **kwargs)
  File "/usr/lib/python3.11/functools.py", line 12, in wrapper
    raise ValueError("bad shape")
ValueError: bad shape"""


def test_the_innermost_frame_of_the_project_is_named_not_a_library_or_the_harness():
    assert project_frame(TRACEBACK) == "/home/user/project/model.py:57 in forward"


def test_only_the_harness_is_named_when_no_other_project_frame_is_in_the_traceback():
    harness_only = ('  File "/work/nsadiag/harness/child.py", line 40, in run\n'
                    '  File "/venv/lib/python3.11/site-packages/torch/nn/functional.py", '
                    'line 9, in linear\n')
    assert project_frame(harness_only) == "/work/nsadiag/harness/child.py:40 in run"
    assert project_frame('  File "/usr/lib/python3.11/queue.py", line 1, in get\n') is None
    assert project_frame("no traceback at all") is None


@pytest.mark.parametrize("exception, flagged, oom", [
    ({"type": "torch.OutOfMemoryError", "message": "CUDA error"}, False, True),
    ({"type": "MemoryError", "message": ""}, False, True),
    ({"type": "RuntimeError", "message": "DefaultCPUAllocator: can't allocate memory: you "
      "tried to allocate 8589934592 bytes"}, False, True),
    ({"type": "RuntimeError", "message": "CUDA Out Of Memory. Tried to allocate 2 GiB"},
     False, True),
    ({"type": "RuntimeError", "message": "mat1 and mat2 shapes cannot be multiplied"},
     False, False),
    ({"type": "RuntimeError", "message": "allocation failed"}, True, True),
    ({}, False, False),
])
def test_memory_exhaustion_by_type_flag_or_message(exception, flagged, oom):
    assert is_oom_exception(exception, flagged) is oom


def test_a_gradient_ready_twice_is_explained_with_the_parameter_it_names():
    message = ("Expected to mark a variable ready only once. This error is caused by ... "
               "Parameter at index 3 with name blocks.1.mlp.weight has been marked as ready "
               "twice. This means that multiple autograd engine hooks have fired")
    found = explain_exception("RuntimeError", message)
    assert found["parameter"] == "blocks.1.mlp.weight"
    assert found["cause"].startswith("a parameter received its gradient twice in one "
                                     "backward (blocks.1.mlp.weight): with reentrant "
                                     "checkpointing")
    assert any("use_reentrant=False" in fix for fix in fixes_for(found["known"]))


def test_a_ready_twice_without_a_name_and_an_unknown_message():
    unnamed = explain_exception("RuntimeError", "Expected to mark a variable ready only once.")
    assert unnamed["parameter"] is None
    assert unnamed["cause"].startswith("a parameter received its gradient twice in one "
                                       "backward: ")
    assert explain_exception("RuntimeError", "mat1 and mat2 shapes cannot be multiplied") is None
