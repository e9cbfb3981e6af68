"""Device buffers kept across renders, so a training step allocates no new Warp arrays."""

from __future__ import annotations

import collections
import gc
import weakref
from typing import NamedTuple

import warp as wp

from arc_warp._src.arc.calibrate import resolve_threshold


_PYTHON_DTYPES = {float: wp.float32, int: wp.int32, bool: wp.bool}  # as wp.array stores them
_REPACK = object()  # signature of an argument that is always repacked (structs, vectors)
SORT_HISTORY = 64  # renders whose intersection totals set the sort size kept for the next
SORT_SLACK = 4096  # entries added to every kept sort size, so small scenes rarely overflow
GRAPHS_PER_FRAME = 24  # CUDA graphs a frame keeps (least recently used dropped first)
# the shared frame's buffers a render leaves nothing in for a later call (Workspace.release)
SCRATCH_ARENA = "scratch"  # a frame's scratch arena's name (Frame.scratch)
SHARED_SCRATCH = (SCRATCH_ARENA, "entry_grads")
BACKWARD_ARENA = "grad_scratch"  # the arena's name in the backward's own frame (Workspace.backward_shared)
# Frame.release keeps buffers that sum to less: small blocks share an allocator's pool with
# many small tensors, so they rarely come back at their address, and saving them is moot
RELEASE_MIN_BYTES = 4 << 20
SCRATCH_ALIGN = 256  # byte alignment of each part carved from the scratch arena (Frame.scratch)
# render calls a workspace keeps to repeat: a loop that holds the previous output while
# rendering alternates two frames and two output blocks of the torch bridge's pool
RENDER_PLANS = 4


def signature(arg):
    """What must be unchanged for a packed launch argument to be reused."""
    if isinstance(arg, wp.array):
        return (arg.ptr, arg.shape, arg.strides)
    if arg is None or isinstance(arg, (bool, int, float)):
        return arg
    return _REPACK


class GraphKey(tuple):
    """A graph key: a tuple whose hash is computed once, when it is made. Replays look
    their keys up on every call, and keys nest (a backward's holds its render's), so a
    plain tuple would be hashed again, all the way down, at each lookup."""

    def __new__(cls, items):
        key = super().__new__(cls, items)
        key._hash = tuple.__hash__(key)
        return key

    def __hash__(self):
        return self._hash


class BufferInfo(NamedTuple):
    """One device buffer of a :class:`Workspace` (see ``Workspace.memory_report``)."""

    frame: int  # 0: the shared frames (scratch of one call, the backward's too); 1, 2, ...: render frames
    name: str
    dtype: type  # Warp dtype
    shape: tuple
    nbytes: int  # bytes allocated (a capacity buffer's spare room included)


class _BlockPlan:
    """The layout of one block of buffers a frame hands back and takes back together
    (:meth:`Frame.release`, :meth:`Frame.restore`): their names and bytes, each one's
    aligned offset, the total, and the block's base the last time it came back with the
    buffers at those offsets. Valid while the workspace's allocation count is
    ``allocations`` (no buffer was made or moved since)."""

    __slots__ = ("sizes", "names", "offsets", "total", "allocations", "base")

    def __init__(self, sizes: dict, allocations: int):
        self.sizes, self.names, self.allocations, self.base = sizes, frozenset(sizes), allocations, None
        self.offsets, total = [], 0
        for name, nbytes in sizes.items():
            self.offsets.append((name, total))
            total += -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        self.total = total


class Frame:
    """The buffers of one render in flight: its forward state, scratch and outputs.

    Buffers are looked up by name; one is (re)allocated only when its shape or dtype
    changes, so renders of one size reuse them. A frame is leased to one
    :class:`RenderOutput` and returns to its :class:`Workspace` when that output is
    garbage collected (its backward can no longer run), so two renders alive at once
    never share buffers.
    """

    def __init__(self, workspace: Workspace, shared: Frame | None = None, arena: str = SCRATCH_ARENA):
        self._workspace = workspace
        self._arena = arena  # the name of its scratch arena (see scratch)
        # buffers used only within one call (sort keys, scans, gradient scratch),
        # shared by all frames of the workspace: work on one stream is ordered
        self.shared = self if shared is None else shared
        self._arrays: dict[str, wp.array] = {}
        self._launches: dict = {}  # key -> [wp.Launch, dim, argument signatures]
        self._event = None
        self._graphs: collections.OrderedDict = collections.OrderedDict()  # key -> (wp.Graph, result)
        self._seen: collections.OrderedDict = collections.OrderedDict()  # keys queued once without allocating
        self._numpy: dict = {}  # (pointer, shape, dtype) of a host buffer -> its numpy view
        self._retired = None  # the arena a part outgrew, alive until the next stage (see scratch)
        # with Workspace.allocator: what holds each buffer's memory, by name; what holds each
        # block of a restore, by its buffers' names; {name: bytes} of the buffers handed back
        self._owners: dict = {}
        self._blocks: dict[frozenset, object] = {}
        self._released: dict = {}
        self._plans: dict = {}  # release's ``names`` -> _BlockPlan of a whole-frame release
        self._restoring = None  # the _BlockPlan of what is released, if one release made it
        self._keep: set = set()  # names of buffers never handed back (zeros_once, host_array)

    @property
    def device(self):
        """The Warp device of the workspace this frame belongs to."""
        return self._workspace.device

    @property
    def backward_shared(self) -> Frame:
        """The frame of the backward's scratch (``Workspace.backward_shared``)."""
        return self._workspace.backward_shared

    def _buffer(self, name: str, shape, dtype, zero_new: bool, host: bool = False) -> tuple[wp.array, bool]:
        """The buffer ``name`` of exactly ``shape`` and ``dtype`` (on the host with ``host``),
        and whether it is new."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = _PYTHON_DTYPES.get(dtype, dtype)
        a = self._held(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = self._arrays[name] = self._allocate(name, shape, dtype, zero_new, host)
            return a, True
        return a, False

    def _held(self, name: str) -> wp.array | None:
        """The buffer ``name`` (None: never made), its memory taken back first if it was
        handed back (:meth:`restore`)."""
        if name in self._released:
            self.restore()
        return self._arrays.get(name)

    def _allocate(self, name: str, shape: tuple, dtype, zero: bool, host: bool = False) -> wp.array:
        a, owner = self._workspace._allocate(shape, dtype, zero, host)
        if owner is not None:
            self._owners[name] = owner
        return a

    def array(self, name: str, shape, dtype, zero: bool = False) -> wp.array:
        """The buffer ``name`` with exactly ``shape`` and ``dtype``; ``zero`` memsets it."""
        a, new = self._buffer(name, shape, dtype, zero)
        if zero and not new:
            a.zero_()
        return a

    def zeros_once(self, name: str, shape, dtype) -> wp.array:
        """A read-only zero buffer: zeroed when allocated, never written afterwards (and
        never handed back by :meth:`release`)."""
        self._keep.add(name)
        return self._buffer(name, shape, dtype, True)[0]

    def release(self, names=None) -> None:
        """Hand the memory of this frame's device buffers (those of ``names``; None: all
        but its host and zeros_once buffers) back to the workspace's ``allocator`` (no-op
        without one, or for less than ``RELEASE_MIN_BYTES`` in all); their contents are
        lost. They come back, as one block, when one of them is next used
        (:meth:`restore`): release only buffers that nothing reads before writing them
        again (the torch bridge releases a render's once its backward can no longer run).
        Work already queued on the allocator's stream still reads them safely: a
        stream-ordered allocator (torch's) hands the memory out again only to work queued
        after it."""
        workspace = self._workspace
        if workspace.allocator is None:
            return
        if names is not None and all(name in self._released or name not in self._arrays for name in names):
            return  # already handed back (release_forward's arena, on every step's release)
        # a training step releases the same buffers each time: their block's layout is
        # worked out once per buffers made (the allocation count)
        plan = self._plans.get(names) if not self._released else None
        if plan is None or plan.allocations != workspace.allocations:
            device = workspace.device
            chosen = {name: a.capacity for name, a in self._arrays.items()
                      if a.device == device and name not in self._keep and name not in self._released
                      and (names is None or name in names)}
            if sum(chosen.values()) < RELEASE_MIN_BYTES:
                return
            plan = _BlockPlan(chosen, workspace.allocations)
            if not self._released:
                if len(self._plans) >= 8:
                    self._plans.clear()
                self._plans[names] = plan
        for name in plan.sizes:
            self._owners.pop(name, None)
        self._restoring = plan if not self._released else None
        self._released.update(plan.sizes)
        for block in [k for k in self._blocks if k <= self._released.keys()]:
            del self._blocks[block]  # a restored block none of whose buffers is in use
        self._retired = None

    def restore_plan(self) -> _BlockPlan | None:
        """The layout of the block :meth:`restore` takes back (None: nothing released)."""
        if not self._released:
            return None
        if self._restoring is None:  # released in parts
            self._restoring = _BlockPlan(self._released, self._workspace.allocations)
        return self._restoring

    def restore(self, block: tuple | None = None) -> None:
        """Take back the memory :meth:`release` handed back, as one block; a buffer at its
        old address keeps its array (so kept graphs, launches and views stay valid), and if
        any moved, the workspace's ``allocations`` count changes (kept graphs are not
        replayed). No-op unless released. ``block``: the (pointer, owner) of memory to
        take it back at, of at least ``restore_plan().total`` bytes (``Workspace.restore``
        takes several frames' back in one allocation); None allocates it."""
        plan = self.restore_plan()
        if plan is None:
            return
        self._released, self._restoring = {}, None
        workspace = self._workspace
        base, self._blocks[plan.names] = workspace.allocator(plan.total) if block is None else block
        if base == plan.base:
            return  # where this plan's block last came back: its buffers are there (release checked them)
        moved = False
        for name, offset in plan.offsets:
            a = self._arrays[name]
            if a.ptr != base + offset:
                self._arrays[name] = wp.array(ptr=base + offset, dtype=a.dtype, shape=a.shape, capacity=a.capacity,
                                              device=workspace.device)
                moved = True
        if moved:
            workspace.allocations += 1
        plan.base, plan.allocations = base, workspace.allocations

    def launch(self, kernel, dim, args: list, block_dim: int | None = None, key=None) -> None:
        """``wp.launch(kernel, dim, inputs=args)`` on the current stream, prepared once per
        frame and replayed: later calls repack only the arguments that changed (an array
        whose pointer, shape and strides are the same is not repacked). ``dim`` is an int
        or a tuple of ints; ``key`` (default: the kernel) names the prepared launch when
        one kernel is launched at several places."""
        if dim == 0:
            return  # Warp records no command for an empty launch
        if not self._workspace.replay:
            wp.launch(kernel, dim=dim, inputs=args, device=self._workspace.device, block_dim=block_dim,
                      record_tape=False)
            return
        key = kernel if key is None else key
        record = self._launches.get(key)
        if record is None:
            cmd = wp.launch(kernel, dim=dim, inputs=args, device=self._workspace.device, block_dim=block_dim,
                            record_cmd=True, record_tape=False)
            cmd.fwd_args = None  # kept by Warp only for APIC capture; would pin the first call's arrays
            self._launches[key] = [cmd, dim, [signature(a) for a in args]]
        else:
            cmd, old_dim, signatures = record
            if dim != old_dim:
                cmd.set_dim(dim)
                record[1] = dim
            for i, arg in enumerate(args):
                sig = signature(arg)
                if sig is _REPACK or sig != signatures[i]:
                    cmd.set_param_at_index(i, arg)
                    signatures[i] = sig
        cmd.launch()

    def replay(self, key, queue):
        """Runs ``queue()``, which queues device work through this frame and returns what
        describes it, as a CUDA graph replayed by ``key``.

        ``key`` must fix every pointer and value the queued work uses that is not a
        buffer of this workspace (buffers are covered: the key is taken together with the
        workspace's allocation count, which any new buffer changes). A key queued once
        without allocating is captured the second time (the capture does not run the
        work; the graph is launched after it), and from then on replayed with one graph
        launch instead of ``queue()``'s Python and launches; the result stored with the
        graph is returned again, so it must not refer to anything outside the key.
        ``key=None``, a CPU device or ``Workspace.graphs`` False just call ``queue()``.

        Memory handed back (:meth:`release`) must be back first (``Workspace.restore``): a
        buffer that moves changes the allocation count, and an allocation inside a
        capture would break it."""
        workspace = self._workspace
        if key is None or not workspace.graphs:
            return queue()
        key = GraphKey((key, workspace.allocations))
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            self.launch_graph(entry[0])
            return entry[1]
        if key not in self._seen:
            result = queue()
            if workspace.allocations == key[1]:
                self._seen[key] = None
                if len(self._seen) > 4 * GRAPHS_PER_FRAME:
                    self._seen.popitem(last=False)
            return result
        del self._seen[key]
        stream = self.device.stream
        # no garbage collection inside the capture: a collected object's CUDA calls (freeing
        # pinned memory, destroying a graph or stream) are illegal while a stream captures
        collecting = gc.isenabled()
        gc.disable()
        try:
            # captured on a stream of our own: torch's default (legacy NULL) stream cannot capture
            with wp.ScopedStream(workspace.capture_stream(), sync_enter=False):
                with wp.ScopedCapture(self.device, force_module_load=False) as capture:
                    result = queue()
        finally:
            if collecting:
                gc.enable()
        wp.capture_launch(capture.graph, stream=stream)
        if workspace.allocations == key[1]:  # else its buffers moved: never replayed
            self._graphs[key] = (capture.graph, result)
            if len(self._graphs) > GRAPHS_PER_FRAME:
                self._graphs.popitem(last=False)
        return result

    def kept_graph(self, key):
        """The graph :meth:`replay` keeps for ``key`` at the workspace's current allocation
        count, or None (not captured yet, or dropped). For callers that keep it to launch
        again themselves (:meth:`launch_graph`) while the allocation count stays the same
        (``render.py``'s ``_RenderPlan``), skipping ``queue``'s preparation and the key
        lookup."""
        entry = self._graphs.get(GraphKey((key, self._workspace.allocations)))
        return None if entry is None else entry[0]

    def launch_graph(self, graph, stream: wp.Stream | None = None) -> None:
        """Launch a graph of this frame on ``stream`` (None: the device's current stream)."""
        wp.capture_launch(graph, stream=stream)

    def host_array(self, name: str, shape, dtype) -> wp.array:
        """A host buffer ``name`` that device copies into without blocking (page-locked on
        CUDA; on the CPU the host is the device); never handed back by :meth:`release`
        (deferred checks read it later)."""
        self._keep.add(name)
        return self._buffer(name, shape, dtype, False, host=True)[0]

    def host_numpy(self, a: wp.array):
        """A numpy view of the host buffer ``a`` (made once per buffer: ``wp.array.numpy()``
        costs more host time than the rest of a replayed render's readback)."""
        key = (a.ptr, a.shape, a.dtype)
        v = self._numpy.get(key)
        if v is None:
            v = self._numpy[key] = a.numpy()
        return v

    def event(self) -> wp.Event | None:
        """This frame's reusable CUDA event (None on the CPU, where work is synchronous)."""
        if self._event is None and self.device.is_cuda:
            self._event = wp.Event(self.device)
        return self._event

    def capacity(self, name: str, count: int, dtype, headroom: bool = True) -> wp.array:
        """A 1D buffer ``name`` of at least ``count`` entries (grown to 1.5x ``count``, or
        exactly ``count`` without ``headroom``; never shrunk), for sizes that vary from
        call to call such as the tile-sort buffers."""
        a = self._held(name)
        if a is None or a.shape[0] < count or a.dtype != dtype:
            a = self._arrays[name] = self._allocate(name, (max(count + count // 2 if headroom else count, 1),),
                                                    dtype, False)
        return a

    def scratch(self, shape, dtype, after: wp.array | None = None, room: int = 0, zero: bool = False) -> wp.array:
        """A ``shape`` view of ``dtype`` into this frame's scratch arena: one byte buffer
        whose stages take turns, so a stage's scratch costs no memory beyond the largest
        stage's (the forward's depth and tile sorts and the backward's gradients share the
        shared frame's, unless the backward has a frame of its own,
        ``Workspace.backward_shared``).

        ``after`` None starts a stage: the view is at offset 0, and the arena is grown
        first (never shrunk) to ``room`` bytes, which should cover every part the stage
        will take. ``after`` (a view of this stage) places the view at the next
        ``SCRATCH_ALIGN`` boundary past it, over any later part (dead by then). A part
        that does not fit raises, unless its ``room`` covers it: then it goes to a new
        arena of ``room`` bytes, at the same offset, and the old arena, which holds the
        stage's earlier parts (still readable; nothing more may follow them), lives until
        the next stage starts. A view is valid until the next stage starts. ``zero``
        memsets it."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = _PYTHON_DTYPES.get(dtype, dtype)
        size = wp.types.type_size_in_bytes(dtype)
        for d in shape:
            size *= d
        arena = self._held(self._arena)
        if after is None:
            offset = 0
            self._retired = None
            if arena is None or arena.capacity < max(room, size):
                arena = self._arrays[self._arena] = self._allocate(self._arena, (max(room, size, 1),), wp.uint8,
                                                                   False)
        else:
            offset = -(-(after.ptr - arena.ptr + after.capacity) // SCRATCH_ALIGN) * SCRATCH_ALIGN
            if offset + size > arena.capacity:
                if offset + size > room:
                    raise RuntimeError(f"Frame.scratch: a {size}-byte part past byte {offset} overflows the "
                                       f"{arena.capacity}-byte arena; the stage's first part must ask for more room")
                # moving the earlier parts would take a copy; their readers are queued before
                # the next stage, which drops the old arena (freed in stream order)
                self._retired = (arena, self._owners.get(self._arena))
                arena = self._arrays[self._arena] = self._allocate(self._arena, (room,), wp.uint8, False)
        view = self._workspace.view(arena.ptr + offset, dtype, shape)
        if zero:
            view.zero_()
        return view

    def buffers(self) -> list[tuple[str, wp.array]]:
        """(name, array) of every buffer this frame holds (none of those it released)."""
        return [(name, a) for name, a in self._arrays.items() if name not in self._released]


class CurrentStream:
    """Makes ``stream`` the current stream of its Warp ``device`` for a block, without a
    wait on the previous one (the caller orders the work: the torch bridge queues
    everything on torch's stream) and without making the device current (the calls
    inside name their device). ``stream`` None leaves the current stream. One block at a
    time: entering it again inside its block would lose the stream to restore."""

    __slots__ = ("device", "stream", "saved")

    def __init__(self, device, stream: wp.Stream | None):
        self.device, self.stream = device, stream

    def __enter__(self):
        self.saved = self.device.stream if self.stream is not None else None
        if self.saved is not self.stream:
            self.device.set_stream(self.stream, sync=False)

    def __exit__(self, *exc):
        if self.saved is not self.stream:
            self.device.set_stream(self.saved, sync=False)
        return False


class _Busy:
    """``Workspace.busy``: a re-entrant context marking a call that queues work through the
    workspace's frames; releases asked for inside it (``Workspace.release``) run at its end."""

    __slots__ = ("workspace", "depth")

    def __init__(self, workspace: Workspace):
        self.workspace, self.depth = workspace, 0

    def __enter__(self):
        self.depth += 1

    def __exit__(self, *exc):
        self.depth -= 1
        workspace = self.workspace
        if not self.depth and workspace._release_later:
            frames, workspace._release_later = workspace._release_later, []
            workspace.release(frames)
        return False


class Workspace:
    """Buffers and settings of repeated renders on one device (explicit state, no globals).

    Pass it to :func:`render_gaussians` (``workspace=``) or to the mesh ops and their
    backwards (``workspace=``: scratch buffers and prepared launches). Renders of the
    same N and image size then allocate nothing: each takes a :class:`Frame` (the state its
    backward needs) from the free list and the frame goes back when the render's output
    is dropped; buffers used only within one call are shared by all frames. A training
    loop that still holds the previous step's output while rendering the next one
    (``colors = rasterization(...)`` rebinds only after the call) alternates between
    two frames, so it allocates in its first two steps and never after.

    Args:
        device: Warp device (default: the current one).
        threshold: ARC threshold to use when ``RenderSettings.threshold`` (or a mesh op's
            ``threshold``) is None, for both kinds of accumulation; ``None`` resolves the
            device's calibrated values HERE, once (on a GPU that was never calibrated this
            runs the calibration), so that no step ever calibrates lazily (which would
            also break graph capture).

    Attributes:
        allocations: number of Warp arrays this workspace has allocated so far; a
            repeated forward + backward of one size leaves it unchanged.
        threshold: the resolved ARC threshold of the splat renderer (warps that share one
            target).
        keyed_threshold: the resolved ARC threshold of the mesh ops' backwards (lanes
            aiming at different targets, planned with ``keyed_plan``; see
            ``arc_warp.resolve_threshold``).
        replay: False for a workspace used once (``render_gaussians`` without
            ``workspace=``): its launches go straight to ``wp.launch``, since preparing a
            launch for replay costs more host time than it saves on a single call.
        graphs: on CUDA (with ``replay``), a render or backward repeated with the same
            arguments (array pointers, shapes, camera, settings, sort size) is captured
            into a CUDA graph the second time and replayed after (``Frame.replay``): one
            graph launch instead of a dozen kernel launches and their Python. False
            (``graphs=False``) always launches kernel by kernel; always False on the CPU.
        allocator: ``None`` (Warp's pool holds every buffer for the workspace's life), or a
            callable ``nbytes -> (pointer, owner)`` giving device memory held while
            ``owner`` is referenced, from an allocator outside Warp's (the torch bridge
            passes torch's caching allocator): then :meth:`release` hands the memory of
            finished renders back to it between steps, for the caller's other work (an
            optimizer step) to reuse, and their next use takes it back. The allocator must
            be stream-ordered on the stream the work runs on, as torch's is.
        deferred: the pending checks of renders queued without waiting for the device
            (the torch bridge's ``defer_checks``, for inputs the same as the previous
            call's), run by ``render.settle_deferred``: in their backward, or at the start
            of the next render on this workspace.
        capturing: True while a caller's CUDA graph capture records this workspace's
            renders (:class:`capture.CapturedRenders`): deferred checks are kept for after
            the replays, and a render that would wait for the device raises instead.
    """

    def __init__(self, device=None, threshold: int | None = None, replay: bool = True, graphs: bool = True,
                 allocator=None):
        self.device = wp.get_device(device)
        self.allocator = allocator
        self.replay = replay
        self.graphs = bool(graphs and replay and self.device.is_cuda)
        self.threshold = resolve_threshold(self.device, threshold)
        self.keyed_threshold = resolve_threshold(self.device, threshold, keyed=True)
        self.allocations = 0
        self._free: list[Frame] = []
        self._shared = Frame(self)
        self._backward_shared = None  # made on first use with an allocator (backward_shared)
        self._frames: list[Frame] = []  # every render frame made (leased or free), for memory_report
        # kernel arguments derived from a Camera, by id; the entry keeps the camera alive
        # so an id is never reused while cached
        self.camera_args: dict[int, tuple] = {}
        # render calls that replayed a kept graph, newest first, to repeat without their
        # preparation (render.py `_RenderPlan`); at most RENDER_PLANS
        self.render_plans: list = []
        # a backward's graph key by the arrays and render key it is made of (render.py
        # `_prepare_backward`): a repeated backward skips making their signatures
        self.backward_keys: dict = {}
        # (weak reference to the output, pending check, output arrays) of renders queued with
        # their checks deferred (render.py `render_checked(defer=True)`, `settle_deferred`)
        self.deferred: list = []
        # the inputs (pointers, shapes) and settings of the last render call that could defer
        # its checks (render.py `render_checked`)
        self.last_input_key = None
        self.capturing = False  # see capture.CapturedRenders
        self._sort_sizes: dict[tuple[int, int], list] = {}  # grid -> [size, recent totals]
        self._views: dict[tuple, wp.array] = {}  # (pointer, dtype, shape) -> non-owning view
        self._capture_stream = None
        # ``with workspace.busy:`` around a call that queues work through the frames
        self.busy = _Busy(self)
        self._release_later: list[Frame] = []  # frames released while busy (see release)

    def _allocate(self, shape: tuple, dtype, zero: bool, host: bool = False) -> tuple[wp.array, object]:
        """A new buffer and what holds its memory (None: the array itself)."""
        self.allocations += 1
        maker = wp.zeros if zero else wp.empty
        if host:
            return maker(shape, dtype=dtype, device="cpu", pinned=self.device.is_cuda), None
        if self.allocator is None:
            return maker(shape, dtype=dtype, device=self.device), None
        nbytes = wp.types.type_size_in_bytes(dtype)
        for d in shape:
            nbytes *= d
        ptr, owner = self.allocator(max(nbytes, 1))
        a = wp.array(ptr=ptr, dtype=dtype, shape=shape, device=self.device)
        if zero:
            a.zero_()
        return a, owner

    def release(self, frames) -> None:
        """Hand back the memory of ``frames`` (renders whose backward can no longer run)
        and of the shared frame's render scratch (``Frame.release``) to the ``allocator``;
        no-op without one. The shared frame's other buffers stay: the mesh ops keep state
        in some of theirs from call to call. Inside a call that queues work on this
        workspace (:attr:`busy`: a garbage collection can finish an old render there),
        the release waits for the call's end: the call is using the shared scratch."""
        if self.busy.depth:
            self._release_later.extend(frames)
            return
        for frame in frames:
            frame.release()
        self._shared.release(SHARED_SCRATCH)
        if self._backward_shared is not None:
            self._backward_shared.release()

    def release_forward(self) -> None:
        """Hand back the shared frame's scratch arena (``Frame.release``) once a render call
        has queued its work and settled: the forward's depth and tile sorts are done with
        it, and the backward has a frame of its own (:attr:`backward_shared`), so a render's
        backward does not hold the tile sort's keys, sized by the intersections. No-op
        without an ``allocator``."""
        if self.allocator is not None:
            self._shared.release((self._shared._arena,))

    def restore(self, frames, forward: bool = True) -> None:
        """Take back the memory of ``frames`` and of the backward's scratch frame
        (:attr:`backward_shared`; ``Frame.restore``) in one allocation: each frame's block
        is a part of it, alive while any frame uses its part (one allocator call, where each
        was one). With ``forward``, also the shared frame's arena, in an allocation of its
        own (:meth:`release_forward` hands it back at the render call's end, while the
        frames stay). A training step's render restores all of it before its graphs launch;
        its backward then finds everything back."""
        shared = self._backward_shared
        parts = [(frame, plan) for frame in (*frames, self._shared if shared is None else shared)
                 if (plan := frame.restore_plan()) is not None]
        if parts:
            ptr, owner = self.allocator(sum(plan.total for _, plan in parts))
            for frame, plan in parts:
                frame.restore((ptr, owner))
                ptr += plan.total
        if forward and shared is not None:
            self._shared.restore()

    @property
    def backward_shared(self) -> Frame:
        """The frame of the backward's scratch (its arena and ``reduce="deterministic"``'s
        per-entry gradients): the shared frame itself, or with an ``allocator`` a frame of
        its own, whose memory goes and comes back with the render frames', so the forward's
        arena can go back at the end of each render call (:meth:`release_forward`). Two
        arenas would cost more than one where nothing is handed back."""
        if self.allocator is None:
            return self._shared
        if self._backward_shared is None:
            self._backward_shared = Frame(self, arena=BACKWARD_ARENA)
        return self._backward_shared

    @property
    def shared(self) -> Frame:
        """The frame of buffers used only within one call, shared by every render (and by
        the mesh ops' scratch buffers and prepared launches: work on one stream is ordered)."""
        return self._shared

    def view(self, ptr: int, dtype, shape: tuple) -> wp.array:
        """The contiguous memory at ``ptr`` (on this device; a Warp array's or a torch
        tensor's) as a ``shape`` array of ``dtype``: a non-owning view cached by pointer,
        dtype and shape (making a Warp view costs about 10 us of host time; a repeated call
        gets the same object, so prepared launches need not repack it). The caller keeps
        the memory alive while the view is used."""
        key = (ptr, dtype, shape)
        v = self._views.get(key)
        if v is None:
            if len(self._views) >= 512:  # bounded: pointers of freed memory pile up
                self._views.clear()
            v = self._views[key] = wp.array(ptr=ptr, dtype=dtype, shape=shape, device=self.device)
        return v

    def capture_stream(self) -> wp.Stream:
        """The stream ``Frame.replay`` captures graphs on (made on first use); they are
        launched on the caller's current stream."""
        if self._capture_stream is None:
            self._capture_stream = wp.Stream(self.device)
        return self._capture_stream

    def sort_size(self, grid: tuple[int, int]) -> int | None:
        """The intersection sort size to use on a ``grid`` = (tiles_x, tiles_y) image without
        reading the total back first, or None (read it back: no render of that grid yet, or
        a one-off workspace)."""
        entry = self._sort_sizes.get(grid)
        return None if entry is None or not self.replay else entry[0]

    def last_total(self, grid: tuple[int, int]) -> int | None:
        """The intersection total of the last render on a ``grid`` = (tiles_x, tiles_y)
        image, or None before the first."""
        entry = self._sort_sizes.get(grid)
        return entry[1][-1] if entry else None

    def observe_total(self, grid: tuple[int, int], total: int) -> None:
        """Record a render's intersection total on ``grid``: the sort size becomes 1.25x the
        largest of the last ``SORT_HISTORY`` totals (plus ``SORT_SLACK``) when a total
        exceeds it, or when it is over twice that (views of a training set differ, so the
        size follows their recent maximum rather than each view)."""
        entry = self._sort_sizes.get(grid)
        if entry is None:
            entry = self._sort_sizes[grid] = [0, collections.deque(maxlen=SORT_HISTORY)]
        entry[1].append(total)
        # shrinking needs size > 2 * (1.25 max + slack) >= 2.5 total: skip the max otherwise
        if total > entry[0] or 5 * total < 2 * entry[0]:
            want = max(entry[1]) * 5 // 4 + SORT_SLACK
            if total > entry[0] or entry[0] > 2 * want:
                entry[0] = want

    def acquire(self) -> Frame:
        """A free frame, or a new one."""
        if self._free:
            return self._free.pop()
        self._frames.append(Frame(self, self._shared))
        return self._frames[-1]

    def is_free(self, frames) -> bool:
        """Whether every frame of ``frames`` is free (leased to no render)."""
        return all(frame in self._free for frame in frames)

    def lease(self, frames) -> None:
        """Take these free frames (see :meth:`is_free`) for a render, as :meth:`acquire` would."""
        for frame in frames:
            self._free.remove(frame)

    def memory_report(self) -> list[BufferInfo]:
        """Every device buffer this workspace holds, as :class:`BufferInfo` records: the
        shared frames' (``frame`` 0: the shared one's and, with an allocator, the
        backward's, whose arena is ``grad_scratch``) and each render frame's (1, 2, ... in
        order of creation, leased or free). Buffers handed back and host (page-locked)
        buffers are left out. Their ``nbytes`` sum to :meth:`nbytes`; what the buffers
        cost per Gaussian, intersection or pixel is the caller's to divide
        (``benchmarks/memory_report.py`` does)."""
        shared = [(0, self._shared)] + ([(0, self._backward_shared)] if self._backward_shared is not None else [])
        return [BufferInfo(i, name, a.dtype, a.shape, a.capacity)
                for i, frame in (*shared, *enumerate(self._frames, 1))
                for name, a in frame.buffers() if a.device == self.device]

    def nbytes(self) -> int:
        """Bytes of device memory the workspace's buffers hold (see :meth:`memory_report`):
        what a render and its backward keep allocated between steps, since the workspace
        frees nothing."""
        return sum(b.nbytes for b in self.memory_report())

    def release_with(self, owner, frame: Frame) -> None:
        """Return ``frame`` to the pool when ``owner`` (the render's output) is collected."""
        weakref.finalize(owner, self._free.append, frame)
