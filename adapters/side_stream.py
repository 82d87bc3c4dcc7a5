"""SideStream: a second CUDA stream on which LoRA shrinks overlap the base projections.

LoraBatch.begin forks a shrink onto it (it depends only on the projection's input x), the base
GEMM runs meanwhile on the current stream, and LoraBatch.finish joins it back before the expand
adds into the GEMM's output:

    current stream:  ..x ready --fork--> [ base GEMM  x @ W^T -> y ] --join--> [ expand: y += s @ B^T ]
                                   \\                                 /
    side stream:                    `-> [ shrink: s = x @ A^T ] -----'

Every fork is joined before the current stream goes on past the projection, so the side stream's
work sits between two points of the current stream. That is what keeps it safe:
- CUDA graphs: under capture the side stream joins the capture at the fork (it waits on an event
  recorded by the capturing stream) and leaves it at the join; no branch is left unjoined.
- The caching allocator: every tensor the side stream touches is allocated on, and freed after
  the join by, the current stream (s included: LoraBatch allocates it before forking), so a block
  freed on the current stream is never reused while the side stream may still read or write it.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class SideStream:
    """One side stream of one CUDA device and the two events that fork and join it.

    The events are reused by every fork: a stream waits on an event's latest record at the time
    it is told to wait, and the side stream runs in order, so a join covers every fork before it
    (a join after several forks waits for all of them, which is still correct). High priority:
    its small kernels get multiprocessors as soon as the GEMM's blocks free them.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device, priority=-1)  # negative: the highest priority there is
        self._forked, self._done = torch.cuda.Event(), torch.cuda.Event()
        for event in (self._forked, self._done):  # create them now, outside any graph capture
            event.record(self.stream)

    @contextmanager
    def fork(self):
        """Run the body on the side stream, after everything enqueued so far on the current stream."""
        current = torch.cuda.current_stream(self.device)
        self._forked.record(current)
        self.stream.wait_event(self._forked)
        with torch.cuda.stream(self.stream):
            yield
        self._done.record(self.stream)

    def join(self) -> None:
        """Make the current stream wait for everything forked so far."""
        torch.cuda.current_stream(self.device).wait_event(self._done)
