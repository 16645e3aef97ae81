"""The stage worker and the data node: gradients equal autograd's, accumulation and weighted
averaging, typed errors that leave the worker usable, and drop() that frees memory."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from gwtf.errors import TrainingError
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.errors import (
    ActivationError,
    CapacityError,
    GradientShareError,
    UnknownMicrobatchError,
)
from gwtf.node.training.model import Stage
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.trainer import GradientShare, average_gradients
from tests.training.helpers import grad_of, params_equal

PLAN = plan_partition(named_config("llama", "tiny"), 2)
SEED = 5


def activation(seed: int, batch: int = 2, seq: int = 8) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, PLAN.config.d_model, generator=generator, dtype=torch.float64)


def worker(settings: TrainingSettings, replica_id: str = "0") -> StageWorker:
    return StageWorker(PLAN, 1, settings, SEED, replica_id)


def test_forward_and_backward_equal_autograd_on_the_stage(exact_settings: TrainingSettings) -> None:
    stage = worker(exact_settings)
    reference = Stage(PLAN.config, 2, 4, SEED).double()
    x, upstream = activation(1), activation(2)
    out = stage.forward(7, x)
    x_ref = x.clone().requires_grad_(True)
    out_ref = reference(x_ref)
    assert torch.equal(out, out_ref.detach())
    grad_in = stage.backward(7, upstream)
    out_ref.backward(upstream)
    assert torch.equal(grad_in, grad_of(x_ref))
    for (name, param), (_, ref_param) in zip(
        stage.module.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert torch.equal(grad_of(param), grad_of(ref_param)), name
    assert stage.microbatch_count == 1 and stage.in_flight == ()


def test_gradients_accumulate_as_a_sum_over_interleaved_microbatches(
    exact_settings: TrainingSettings,
) -> None:
    one_at_a_time, interleaved = worker(exact_settings), worker(exact_settings)
    expected: dict[str, torch.Tensor] = {}
    for m in (1, 2):
        one_at_a_time.forward(m, activation(m))
        one_at_a_time.backward(m, activation(10 + m))
        for name, param in one_at_a_time.module.named_parameters():
            expected[name] = expected.get(name, torch.zeros_like(param)) + grad_of(param)
        one_at_a_time.discard_gradients()
    interleaved.forward(1, activation(1))
    interleaved.forward(2, activation(2))
    for m in (2, 1):  # backward order differs from forward order
        interleaved.backward(m, activation(10 + m))
    for name, param in interleaved.module.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-13, atol=1e-15)
    assert interleaved.microbatch_count == 2


def test_average_weights_replicas_by_microbatch_count(exact_settings: TrainingSettings) -> None:
    replicas = [worker(exact_settings, f"r{i}") for i in range(3)]
    counts = [3, 1, 0]
    m = 0
    for replica, count in zip(replicas, counts, strict=True):
        for _ in range(count):
            replica.forward(m, activation(m))
            replica.backward(m, activation(100 + m))
            m += 1
    sums = [replica.gradient_share() for replica in replicas]
    expected = {
        name: (sums[0].gradients[name] + sums[1].gradients[name]) / 4 for name in sums[0].gradients
    }
    assert average_gradients(replicas) == 4
    for replica in replicas:
        for name, param in replica.module.named_parameters():
            torch.testing.assert_close(param.grad, expected[name], rtol=1e-13, atol=1e-16)
        replica.step()
    assert params_equal(replicas[0], replicas[1]) and params_equal(replicas[0], replicas[2])


def test_average_over_a_subset_leaves_dead_replicas_out(exact_settings: TrainingSettings) -> None:
    alive, dead = worker(exact_settings, "a"), worker(exact_settings, "b")
    for replica, m in ((alive, 1), (dead, 2)):
        replica.forward(m, activation(m))
        replica.backward(m, activation(m + 50))
    own = alive.gradient_share()
    assert alive.average_gradients([own]) == 1
    for name, param in alive.module.named_parameters():
        assert torch.equal(grad_of(param), own.gradients[name])


def test_bad_gradient_shares_are_refused(exact_settings: TrainingSettings) -> None:
    stage = worker(exact_settings)
    stage.forward(1, activation(1))
    stage.backward(1, activation(2))
    share = stage.gradient_share()
    with pytest.raises(GradientShareError, match="duplicate"):
        stage.average_gradients([share, share])
    stranger = GradientShare("x", 1, {"blocks.0.norm1.weight": torch.zeros(64)})
    with pytest.raises(GradientShareError, match="same stage"):
        stage.average_gradients([share, stranger])
    wrong = dict(share.gradients)
    wrong["blocks.0.norm1.weight"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(GradientShareError, match="expected floating"):
        stage.average_gradients([GradientShare("y", 1, wrong)])
    with pytest.raises(GradientShareError, match="nothing to average"):
        stage.average_gradients([GradientShare("z", 0, share.gradients)])
    stage.step()  # still usable: the own gradient was never replaced


def test_peer_errors_are_typed_and_leave_the_worker_usable(
    exact_settings: TrainingSettings,
) -> None:
    stage = worker(exact_settings)
    with pytest.raises(UnknownMicrobatchError, match="microbatch 9"):
        stage.backward(9, activation(1))
    with pytest.raises(ActivationError, match="dtype"):
        stage.forward(1, activation(1).float())
    with pytest.raises(ActivationError, match="shape"):
        stage.forward(1, torch.zeros(2, 8, 63, dtype=torch.float64))
    with pytest.raises(ActivationError, match="sequence length"):
        stage.forward(1, torch.zeros(1, PLAN.config.block_size + 1, 64, dtype=torch.float64))
    stage.forward(1, activation(1))
    with pytest.raises(ActivationError, match="shape"):
        stage.backward(1, activation(2, seq=4))
    with pytest.raises(ActivationError, match="dtype"):
        stage.backward(1, activation(2).float())
    assert stage.in_flight == (1,)
    stage.backward(1, activation(2))
    assert stage.step().microbatch_count == 1


def test_drop_frees_the_saved_state(exact_settings: TrainingSettings) -> None:
    stage = worker(exact_settings)
    stage.forward(1, activation(1))
    saved = stage._saved[1]
    graph_output = weakref.ref(saved.outputs)
    graph_input = weakref.ref(saved.inputs)
    del saved
    assert stage.drop(1) is True
    gc.collect()
    assert stage.in_flight == ()
    assert graph_output() is None and graph_input() is None
    assert stage.drop(1) is False
    with pytest.raises(UnknownMicrobatchError):
        stage.backward(1, activation(2))


def test_resent_forward_replaces_state_and_capacity_is_enforced(
    exact_settings: TrainingSettings,
) -> None:
    from dataclasses import replace

    stage = worker(replace(exact_settings, max_in_flight=2))
    stage.forward(1, activation(1))
    stage.forward(1, activation(3))  # a re-sent hop: the newest input wins
    stage.forward(2, activation(2))
    with pytest.raises(CapacityError, match="another replica"):
        stage.forward(3, activation(3))
    assert stage.in_flight == (1, 2)


def test_step_needs_gradients_and_training_is_deterministic(
    exact_settings: TrainingSettings,
) -> None:
    runs = []
    for _ in range(2):
        stage = worker(exact_settings)
        with pytest.raises(TrainingError, match="backward first"):
            stage.step()
        for m in range(2):
            stage.forward(m, activation(m))
            stage.backward(m, activation(m + 20))
        stage.step()
        runs.append(stage)
    assert params_equal(*runs)


def test_data_node_errors_and_tied_weights(
    exact_settings: TrainingSettings, sampler: MicrobatchSampler
) -> None:
    gpt_plan = plan_partition(named_config("gpt", "tiny"), 2)
    data = DataNodeWorker(gpt_plan, exact_settings, SEED, sampler)
    assert data.part.head.weight is data.part.token_embedding.weight
    first = data.embed(4)
    assert first.shape == (2, 16, 64)
    with pytest.raises(ActivationError, match="targets"):
        data.loss_and_backward(4, torch.zeros(2, 8, 64, dtype=torch.float64))
    with pytest.raises(UnknownMicrobatchError):
        data.backward_embedding(5, first)
    loss, grad = data.loss_and_backward(4, first)
    assert 4.0 < loss < 7.0  # about ln(256) at initialisation
    data.backward_embedding(4, grad)
    assert data.in_flight == () and data.microbatch_count == 1
    data.step()


def test_a_microbatchs_loss_computed_again_replaces_the_first_in_the_step(
    exact_settings: TrainingSettings, sampler: MicrobatchSampler
) -> None:
    """A restarted try's forward reaching the loss again from another input (other hardware
    upstream): the head's gradient and the count are those of the later loss alone."""
    once, twice = (DataNodeWorker(PLAN, exact_settings, SEED, sampler) for _ in range(2))
    for data in (once, twice):
        data.loss_and_backward(8, activation(8, seq=16))  # another microbatch, kept as it is
        data.embed(3)
    first_try = twice.loss_and_backward(3, activation(1, seq=16))
    assert twice.drop(3) is True  # the try given up: its loss stays in the step
    twice.embed(3)
    later = twice.loss_and_backward(3, activation(2, seq=16))
    loss, grad = once.loss_and_backward(3, activation(2, seq=16))
    assert first_try[0] != later[0] == loss and torch.equal(grad, later[1])
    assert once.microbatch_count == twice.microbatch_count == 2
    for (name, a), (_, b) in zip(
        once.module.named_parameters(), twice.module.named_parameters(), strict=True
    ):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-12), name
    for data in (once, twice):
        data.step()
    # The next step starts afresh: a loss of microbatch 3 then counts again.
    twice.loss_and_backward(3, activation(2, seq=16))
    assert twice.microbatch_count == 1
