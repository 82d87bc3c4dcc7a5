"""TextGenerator's host_threads: torch's CPU intra-op threads for the process (host_thread_count).

On a GPU the steps' host work is small tensors from one Python thread, and torch's OpenMP pool only contends with
it, so a generator on CUDA runs on one thread unless OMP_NUM_THREADS or host_threads says otherwise; on the CPU the
threads are the model's arithmetic and stay as they are. Oracle: torch.get_num_threads() after the construction.
"""

from __future__ import annotations

import pytest
import torch

from text_generator import ErrorCode, ForwardArgumentError, TextGenerator
from text_generator.generator import host_thread_count

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_one_thread_on_a_gpu_unless_the_environment_or_the_caller_chooses():
    assert host_thread_count(CUDA, None, {}) == 1
    assert host_thread_count(torch.device("cuda:1"), None, {"PATH": "/bin"}) == 1
    assert host_thread_count(CUDA, None, {"OMP_NUM_THREADS": "8"}) is None  # the environment's choice stands
    assert host_thread_count(CPU, None, {}) is None  # the CPU path computes on those threads
    assert host_thread_count(CUDA, 4, {"OMP_NUM_THREADS": "8"}) == 4
    assert host_thread_count(CPU, 3, {}) == 3


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", True])
def test_a_bad_count_is_refused_with_its_code(bad):
    with pytest.raises(ForwardArgumentError) as e:
        host_thread_count(CUDA, bad, {})
    assert e.value.code == ErrorCode.INVALID_HOST_THREADS and e.value.argument == "host_threads"
    assert repr(bad) in str(e.value)


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_a_cpu_generator_leaves_the_threads_and_sets_what_it_is_asked(checkpoint_dir, restore_threads):
    torch.set_num_threads(2)
    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu")
    assert torch.get_num_threads() == 2
    TextGenerator(gen.model_wrapper, host_threads=1)
    assert torch.get_num_threads() == 1


def test_from_pretrained_refuses_a_bad_count_before_loading(tmp_path, restore_threads):
    n = torch.get_num_threads()
    with pytest.raises(ForwardArgumentError) as e:  # (the folder holds no checkpoint: the count is checked first)
        TextGenerator.from_pretrained(str(tmp_path), device="cpu", host_threads=0)
    assert e.value.code == ErrorCode.INVALID_HOST_THREADS
    assert torch.get_num_threads() == n


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cuda_generator_runs_its_host_on_one_thread(checkpoint_dir, restore_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(4)
    TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cuda")
    assert torch.get_num_threads() == 1
    torch.set_num_threads(4)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cuda")
    assert torch.get_num_threads() == 4
