"""Data-parallel training over torch.distributed: process-group setup, spawning, and the
collectives the trainer needs.

Every rank holds the whole model and renders its own slice of each step's camera batch.
One all-reduce per step averages the gradients. All-reduce hands every rank the same bits,
and the rest of the step is deterministic given identical inputs, so parameters, Adam
moments and densification decisions stay bitwise identical on all ranks. NCCL on CUDA
(one GPU per rank, cuda:LOCAL_RANK), gloo on the CPU. Launch with
`torchrun --nproc_per_node N` (which sets RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT) or with `launch(fn, N)`, which does the same without torchrun.
"""

import os
import signal
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as tdist

# Checksum dtype per element size: a float tensor is summed as integers of its own bits,
# so any differing bit changes the sum.
_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def env_world_size() -> int:
    """WORLD_SIZE from the environment (1 when unset): > 1 under torchrun or `launch`."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass(frozen=True)
class DistContext:
    """This process's place in the process group; the default is a single process.

    rank / world_size / local_rank as torchrun defines them; backend "nccl", "gloo" or
    None (single process). All collectives below are no-ops for a single process and must
    otherwise be called by every rank in the same order. owns_group: `close()` destroys
    the group (it was created by `init_distributed`).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = None
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, which alone writes files and prints."""
        return self.rank == 0

    @property
    def comm_device(self) -> torch.device:
        """Where tensors must live for this backend's collectives (NCCL: the rank's GPU)."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @classmethod
    def current(cls) -> "DistContext":
        """The default process group if one is initialised, else a single process."""
        if not (tdist.is_available() and tdist.is_initialized()):
            return cls()
        rank = tdist.get_rank()
        return cls(rank, tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)),
                   str(tdist.get_backend()))

    def close(self) -> None:
        """Destroy the process group if this context created it."""
        if self.owns_group and tdist.is_initialized():
            tdist.destroy_process_group()

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def _all_reduce_flat(self, tensors) -> torch.Tensor:
        """Sum same-dtype, same-device `tensors` over ranks with one all-reduce of their
        concatenation; returns the flat sum (the inputs are left unchanged)."""
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
        return flat

    def sum_(self, *tensors: torch.Tensor) -> None:
        """In place: every tensor (same dtype and device) becomes its sum over ranks."""
        if not self.enabled or not tensors:
            return
        flat = self._all_reduce_flat(tensors)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def average_gradients(self, params: dict, extras: torch.Tensor) -> torch.Tensor:
        """Replace each parameter's .grad by its mean over ranks (a missing .grad counts as
        zeros) and return the mean over ranks of `extras` (a float tensor of per-rank
        scalars such as the loss), all in one all-reduce. Each rank's loss must be the
        mean over an equal share of the batch, so the averaged gradient is that of the
        loss averaged over the whole batch, as a single process computes it."""
        if not self.enabled:
            return extras
        params = list(params.values())
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self._all_reduce_flat(grads + [extras.to(grads[0].dtype)])
        flat /= self.world_size
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return flat[offset:]

    def broadcast_(self, *tensors: torch.Tensor) -> None:
        """In place: every tensor takes rank 0's values."""
        if self.enabled:
            for t in tensors:
                tdist.broadcast(t.detach(), src=0)

    def broadcast_object(self, obj):
        """Rank 0's picklable `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def check_consistent(self, tensors: dict) -> None:
        """Raise RuntimeError on every rank unless each named tensor of `tensors`
        ({name: tensor}, same names in the same order on all ranks) has the same size and
        bits on every rank as on rank 0. Compares two integer checksums of the bits per
        tensor (a plain and a position-weighted sum), so it moves a few bytes per tensor."""
        if not self.enabled:
            return
        local = torch.stack([_checksum(t) for t in tensors.values()]).to(self.comm_device)
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        tdist.all_gather(gathered, local)
        names = list(tensors)
        bad = sorted({f"{names[i]} (rank {r})" for r in range(1, self.world_size)
                      for i in torch.nonzero((gathered[r] != gathered[0]).any(dim=1)).flatten()
                      .tolist()})
        if bad:
            raise RuntimeError("data-parallel ranks diverged from rank 0 in: " + ", ".join(bad))


def _checksum(t: torch.Tensor) -> torch.Tensor:
    """(3,) int64 [numel, sum of bit patterns, sum of bit patterns x (position % 8191 + 1)]
    (int64 sums wrap, which keeps them deterministic)."""
    flat = t.detach().contiguous().reshape(-1)
    bits = flat.view(_BITS_DTYPE[flat.element_size()]).to(torch.int64)
    weights = torch.arange(bits.numel(), device=bits.device) % 8191 + 1
    return torch.stack([torch.tensor(bits.numel(), device=bits.device), bits.sum(),
                        (bits * weights).sum()]).cpu()


def init_distributed(device=None) -> DistContext:
    """Join the process group described by the environment (torchrun's variables), or
    return a single-process context when WORLD_SIZE is unset or 1.

    device: None (CUDA when available), "cuda" or "cpu"; with several processes an indexed
    device is refused, since rank r takes cuda:LOCAL_RANK. CUDA uses NCCL after
    torch.cuda.set_device(LOCAL_RANK), with NVLink multicast off (NCCL_NVLS_ENABLE=0
    unless already set); the CPU uses gloo. If a group already exists it is reused.
    """
    world = env_world_size()
    if world <= 1:
        return DistContext()
    if tdist.is_initialized():
        return DistContext.current()
    if not tdist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={world} but {', '.join(missing)} unset: launch with "
                           "torchrun or arc_warp_train.distributed.launch")
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device(device) if device is not None else \
        torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.index is not None:
        raise ValueError(f"with {world} processes pass device 'cuda' or 'cpu' (rank r uses "
                         f"cuda:LOCAL_RANK), got {device!r}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if dev.type == "cuda":
        if not torch.cuda.is_available() or local >= torch.cuda.device_count():
            raise RuntimeError(f"rank {rank}: LOCAL_RANK {local} needs cuda:{local}, but "
                               f"{torch.cuda.device_count()} CUDA devices are visible")
        torch.cuda.set_device(local)
        tdist.init_process_group("nccl", rank=rank, world_size=world,
                                 device_id=torch.device("cuda", local))
        backend = "nccl"
    elif dev.type == "cpu":
        if not tdist.is_gloo_available():
            raise RuntimeError("multi-process CPU training needs the gloo backend, which this "
                               "torch build lacks")
        tdist.init_process_group("gloo", rank=rank, world_size=world)
        backend = "gloo"
    else:
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return DistContext(rank, world, local, backend, owns_group=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel send SIGTERM to this process when its parent dies (even by
    SIGKILL), so spawned workers never outlive the launcher; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the call above
        os.kill(os.getpid(), signal.SIGTERM)


def _child(index: int, fn, nprocs: int, port: int, args: tuple, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    os.environ.update({"RANK": str(index), "LOCAL_RANK": str(index),
                       "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    fn(*args)


def launch(fn, nprocs: int, args: tuple = ()) -> None:
    """Run `fn(*args)` in `nprocs` fresh (spawned) processes with the environment torchrun
    sets for one node (RANK = LOCAL_RANK = 0..nprocs-1, WORLD_SIZE, MASTER_ADDR 127.0.0.1,
    a free MASTER_PORT); `fn` calls `init_distributed` itself. `fn` and `args` must be
    picklable (a module-level function). Blocks until all finish; if one raises, the others
    are terminated and torch.multiprocessing.ProcessRaisedException is raised here. On
    Linux the workers get SIGTERM when this process dies, even by SIGKILL."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"launch: nprocs must be an int >= 1, got {nprocs!r}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # inherited by the children
    torch.multiprocessing.start_processes(_child, args=(fn, nprocs, free_port(), args,
                                                        os.getpid()),
                                          nprocs=nprocs, join=True, start_method="spawn")
