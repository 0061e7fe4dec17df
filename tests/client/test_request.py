"""ModelLoadRequest, its Builder, and set_policy bundles as wire messages."""

from __future__ import annotations

import dataclasses

import pytest

from npumanager import (
    KEY_MAX_BUDGET,
    KEY_MODEL_SIZE_WEIGHTS,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    Policy,
)
from npumanager.client.request import KEY_MEMORY_BUDGET_BYTES, policy_message
from npumanager.errors import InvalidArgument


def test_request_defaults_builder_and_hashing() -> None:
    a = ModelLoadRequest(id=7, size=ModelSize.GREATER_THAN_2G, priority=ModelPriority.NORMAL)
    b = (ModelLoadRequest.Builder(7).set_size(ModelSize.GREATER_THAN_2G)
         .set_priority(ModelPriority.NORMAL).build())
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    d = ModelLoadRequest(3)
    assert d.size is ModelSize.LESS_THAN_1GB and d.priority is ModelPriority.NORMAL
    assert ModelLoadRequest(1, 2, 1000).size is ModelSize.GREATER_THAN_2G  # ints accepted
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.id = 8  # type: ignore[misc]


@pytest.mark.parametrize("kw", [{"size": 9}, {"priority": 5}, {"id": "x"}, {"id": 1 << 70}])
def test_request_rejects_bad_fields(kw: dict[str, object]) -> None:
    args: dict[str, object] = {"id": 1, **kw}
    with pytest.raises(InvalidArgument):
        ModelLoadRequest(**args)  # type: ignore[arg-type]


def test_callback_base_methods_do_nothing() -> None:
    cb = ModelLoadRequestCallback()
    req = ModelLoadRequest(1)
    cb.on_can_load_model(req, 0, None)  # type: ignore[arg-type]
    cb.on_request_unload_model(req, 0)  # type: ignore[arg-type]
    cb.on_model_load_request_complete(req, 4)  # type: ignore[arg-type]


def test_policy_bundle_to_message() -> None:
    m = policy_message(Policy.BUDGET, {KEY_MAX_BUDGET: 6, KEY_MODEL_SIZE_WEIGHTS: {"2": 3, "0": 1},
                                       KEY_MEMORY_BUDGET_BYTES: 1 << 33})
    assert m.policy == 2 and m.max_budget == 6 and m.memory_budget_bytes == 1 << 33
    assert {w.size: w.weight for w in m.weights} == {2: 3, 0: 1}
    bare = policy_message(Policy.TURN_TAKING, None)
    assert not bare.HasField("max_budget") and not bare.weights


@pytest.mark.parametrize("policy,bundle", [
    ("nope", None), (True, None), (1 << 40, None),
    (2, {"maxbudget": 4}), (2, {KEY_MAX_BUDGET: "4"}), (2, {KEY_MAX_BUDGET: 2.5}),
    (2, {KEY_MODEL_SIZE_WEIGHTS: [1, 2]}), (2, {KEY_MODEL_SIZE_WEIGHTS: {"big": 1}}),
    (2, {KEY_MODEL_SIZE_WEIGHTS: {"3": 1}}), (2, {KEY_MODEL_SIZE_WEIGHTS: {"1": None}}),
])
def test_malformed_bundles_are_invalid_arguments(policy: object, bundle: object) -> None:
    with pytest.raises(InvalidArgument):
        policy_message(policy, bundle)  # type: ignore[arg-type]
