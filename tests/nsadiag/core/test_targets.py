"""TrialSpec validation and target resolution ("nsa" and "pkg.module:factory")."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import nsa.layer
from nsa.model import NSATransformer
from nsadiag.harness.heartbeat import HeartbeatWriter, hook_modules
from nsadiag.spec import TrialSpec
from nsadiag.targets import instrument_branches, resolve
from tests import diag_targets

TINY = {"dim": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "l": 8, "d": 4, "l_sel": 16,
        "n_sel": 3, "w": 16, "query_chunk": 16, "compress_hidden": 16, "vocab_size": 64}


def tiny_spec(**changes) -> TrialSpec:
    base = TrialSpec(target="nsa", overrides=dict(TINY), n_layers=2, seq_len=32, steps=1)
    return base.replace(**changes)


# ----------------------------------------------------------------------------- spec


def test_spec_json_round_trip(tmp_path):
    spec = tiny_spec(branches=("win", "cmp"), memory_cap_bytes=1 << 30,
                     out_dir=str(tmp_path / "t0"))
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    assert TrialSpec.from_json(path) == spec
    assert TrialSpec.from_json(spec.to_json()) == spec
    assert TrialSpec.from_json(path).branches == ("win", "cmp")


@pytest.mark.parametrize("changes, message", [
    ({"seq_len": 0}, "seq_len: must be a positive integer, got 0"),
    ({"batch": -1}, "batch: must be a positive integer, got -1"),
    ({"steps": 0}, "steps: must be a positive integer, got 0"),
    ({"stall_timeout_s": 0}, "stall_timeout_s: must be a positive number of seconds, got 0"),
    ({"budget_s": -2.0}, "budget_s: must be a positive number of seconds, got -2.0"),
    ({"dtype": "float16"}, "dtype: must be one of float32, bfloat16, got 'float16'"),
    ({"device": "tpu"}, "device: must be one of cpu, cuda, auto, got 'tpu'"),
    ({"branches": ("cmp", "xyz")},
     "branches: must be null or a non-empty subset of cmp, sel, win without repeats, "
     "got ['cmp', 'xyz']"),
    ({"target": "nsa2"}, "target: must be 'nsa' or 'pkg.module:factory', got 'nsa2'"),
    ({"overrides": {"n_layers": 4}},
     "overrides: 'n_layers' is a TrialSpec field; set it there (spec fields: n_layers, "
     "seq_len, grad_ckpt, dtype, device, branches, backend, seed)"),
    ({"memory_cap_bytes": 0},
     "memory_cap_bytes: must be a positive integer (bytes) or null, got 0"),
])
def test_spec_validate_names_field_and_allowed_values(changes, message):
    with pytest.raises(ValueError) as info:
        tiny_spec(**changes)
    assert str(info.value) == message


def test_spec_from_json_rejects_unknown_field():
    with pytest.raises(ValueError, match=r"^layers: not a TrialSpec field; fields are "):
        TrialSpec.from_json('{"layers": 3}')


# ----------------------------------------------------------------------------- nsa


def test_nsa_target_applies_overrides_and_knobs():
    target = resolve(tiny_spec(n_layers=3, branches=("cmp", "win"), grad_ckpt=True))
    cfg = target.model.cfg
    assert isinstance(target.model, NSATransformer)
    assert (cfg.dim, cfg.l, cfg.d, cfg.l_sel, cfg.n_sel, cfg.w) == (32, 8, 4, 16, 3, 16)
    assert (cfg.n_layers, cfg.branches, cfg.grad_ckpt) == (3, ("cmp", "win"), True)
    assert target.vocab_size == 64
    assert [name for name, _ in target.blocks] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [name for name, _ in target.branches] == [
        f"blocks.{i}.attn.{b}" for i in range(3) for b in ("cmp", "win")]
    assert target.branches[0][1] is target.model.blocks[0].attn


def test_nsa_target_loss_is_the_model_loss():
    target = resolve(tiny_spec())
    ids = torch.randint(64, (2, 33))
    assert torch.equal(target.loss(ids), target.model.loss(ids))


def test_nsa_target_all_branches_include_selection():
    target = resolve(tiny_spec(n_layers=1))
    assert [name for name, _ in target.branches] == [
        "blocks.0.attn.cmp", "blocks.0.attn.select", "blocks.0.attn.sel", "blocks.0.attn.win"]


@pytest.mark.parametrize("overrides, message", [
    ({"dim": 0}, "dim: must be a positive integer, got 0"),
    ({"l": 10}, "d: must divide l=10, got 4"),
])
def test_nsa_bad_override_names_the_config_field(overrides, message):
    with pytest.raises(ValueError) as info:
        resolve(tiny_spec(overrides={**TINY, **overrides}))
    assert str(info.value) == message


def test_nsa_unknown_override_lists_the_config_fields():
    with pytest.raises(ValueError, match=r"^dimm: not an NSAConfig field; fields are .*\bdim\b"):
        resolve(tiny_spec(overrides={**TINY, "dimm": 8}))


# ----------------------------------------------------------------------------- factories


def test_factory_gets_only_declared_knobs():
    target = resolve(TrialSpec(target="tests.diag_targets:tiny_lm", n_layers=3, seq_len=8))
    assert isinstance(target.model, diag_targets.TinyLM)
    assert [name for name, _ in target.blocks] == ["layers.0", "layers.1", "layers.2"]
    assert target.branches == []
    assert target.vocab_size == diag_targets.VOCAB
    assert target.description == ("tests.diag_targets:tiny_lm(n_layers=3, seq_len=8): TinyLM")
    ids = torch.randint(diag_targets.VOCAB, (2, 9))
    logits = target.model(ids[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    assert torch.allclose(target.loss(ids), expected, rtol=0, atol=1e-6)


def test_factory_refuses_a_knob_it_does_not_declare():
    spec = TrialSpec(target="tests.diag_targets:tiny_lm", grad_ckpt=True)
    with pytest.raises(ValueError) as info:
        resolve(spec)
    assert str(info.value) == ("target: factory tests.diag_targets:tiny_lm does not accept "
                               "'grad_ckpt'; it accepts: n_layers, seq_len")


def test_factory_refuses_an_override_it_does_not_declare():
    spec = TrialSpec(target="tests.diag_targets:scalar_loss", overrides={"width": 4})
    with pytest.raises(ValueError) as info:
        resolve(spec)
    assert str(info.value) == ("target: factory tests.diag_targets:scalar_loss does not "
                               "accept 'width'; it accepts: n_layers")


def test_unimportable_module_is_one_line():
    with pytest.raises(ValueError) as info:
        resolve(TrialSpec(target="tests.no_such_module:make"))
    assert str(info.value) == ("target: cannot import 'tests.no_such_module': "
                               "No module named 'tests.no_such_module'")


def test_missing_factory_is_one_line():
    with pytest.raises(ValueError) as info:
        resolve(TrialSpec(target="tests.diag_targets:no_such_factory"))
    assert str(info.value) == "target: 'tests.diag_targets' has no callable 'no_such_factory'"


def test_factory_returning_a_scalar_loss():
    target = resolve(TrialSpec(target="tests.diag_targets:scalar_loss", n_layers=1))
    ids = torch.randint(diag_targets.VOCAB, (2, 9))
    loss = target.loss(ids)
    inner = target.model.lm(ids[:, :-1])
    expected = F.cross_entropy(inner[:, :-1].flatten(0, 1), ids[:, 1:-1].flatten())
    assert loss.ndim == 0
    assert torch.allclose(loss, expected, rtol=0, atol=1e-6)
    assert [name for name, _ in target.blocks] == ["lm.layers.0"]


# ----------------------------------------------------------------------------- branch probe


def _loss_and_grads(target, ids):
    target.model.zero_grad(set_to_none=True)
    loss = target.loss(ids)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in target.model.parameters()]


def test_branch_probe_is_exact_and_restores_nsa_layer():
    target = resolve(tiny_spec(n_layers=1))
    ids = torch.randint(64, (1, 33))
    originals = (nsa.layer.compressed_attention, nsa.layer.selected_attention,
                 nsa.layer.window_attention, nsa.layer.select_blocks)
    loss_plain, grads_plain = _loss_and_grads(target, ids)
    events = []
    probe = instrument_branches(target, lambda *event: events.append(event))
    try:
        assert nsa.layer.compressed_attention is not originals[0]
        loss_probed, grads_probed = _loss_and_grads(target, ids)
    finally:
        probe.remove()
    assert torch.equal(loss_plain, loss_probed)
    assert all(torch.equal(a, b) for a, b in zip(grads_plain, grads_probed, strict=True))
    assert (nsa.layer.compressed_attention, nsa.layer.selected_attention,
            nsa.layer.window_attention, nsa.layer.select_blocks) == originals
    forward = [e for e in events if e[1] == "forward"]
    assert forward == [(f"blocks.0.attn.{b}", "forward", edge)
                       for b in ("cmp", "select", "sel", "win") for edge in ("enter", "exit")]
    backward = [e for e in events if e[1] == "backward"]
    assert sorted(backward) == sorted((f"blocks.0.attn.{b}", "backward", edge)
                                      for b in ("cmp", "sel", "win") for edge in ("enter", "exit"))
    for branch in ("cmp", "sel", "win"):
        name = f"blocks.0.attn.{branch}"
        assert backward.index((name, "backward", "enter")) < backward.index(
            (name, "backward", "exit"))


def test_watch_writes_block_events_and_removes_hooks(tmp_path):
    target = resolve(TrialSpec(target="tests.diag_targets:tiny_lm", n_layers=2))
    writer = HeartbeatWriter(tmp_path / "events.jsonl")
    ids = torch.randint(diag_targets.VOCAB, (1, 9))
    with hook_modules(target, writer):
        target.loss(ids).backward()
    target.loss(ids).backward()  # hooks removed: no more events
    writer.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    events = [(e["module"], e["phase"], e["edge"]) for e in map(json.loads, lines)]
    assert events == [
        ("layers.0", "forward", "enter"), ("layers.0", "forward", "exit"),
        ("layers.1", "forward", "enter"), ("layers.1", "forward", "exit"),
        ("layers.1", "backward", "enter"), ("layers.1", "backward", "exit"),
        ("layers.0", "backward", "enter"), ("layers.0", "backward", "exit")]
    assert writer.module_events == 8


def test_watch_under_grad_ckpt_shows_recompute_and_keeps_gradients(tmp_path):
    plain = resolve(tiny_spec(n_layers=1))
    ckpt = resolve(tiny_spec(n_layers=1, grad_ckpt=True))
    ckpt.model.load_state_dict(plain.model.state_dict())
    ids = torch.randint(64, (1, 33))
    loss_plain, grads_plain = _loss_and_grads(plain, ids)
    writer = HeartbeatWriter(tmp_path / "events.jsonl")
    with hook_modules(ckpt, writer):
        loss_ckpt, grads_ckpt = _loss_and_grads(ckpt, ids)
    writer.close()
    assert torch.equal(loss_plain, loss_ckpt)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6)
               for a, b in zip(grads_plain, grads_ckpt, strict=True))
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    events = [(e["module"], e["phase"], e["edge"]) for e in map(json.loads, lines)]
    forward = [("blocks.0", "forward", "enter")] + [
        (f"blocks.0.attn.{b}", "forward", edge)
        for b in ("cmp", "select", "sel", "win") for edge in ("enter", "exit")]
    # the recompute runs inside the block's backward and stops before the block's forward exit
    assert events[:10] == forward + [("blocks.0", "forward", "exit")]
    assert events[10] == ("blocks.0", "backward", "enter")
    assert events[11:20] == forward
    assert events[-1] == ("blocks.0", "backward", "exit")
    assert sorted(events[20:-1]) == sorted((f"blocks.0.attn.{b}", "backward", edge)
                                           for b in ("cmp", "sel", "win")
                                           for edge in ("enter", "exit"))
    assert writer.module_events == 27
