"""arc_warp's benchmarks behind one command line: ``python -m benchmarks NAME [args]``.

``python -m benchmarks --help`` lists them. Each writes ``benchmarks/results/NAME.json``
(the device, commit, date and command line with the figures) and prints its table;
``python -m benchmarks report`` regenerates BENCHMARKS.md from those files. ``--smoke``
runs a benchmark at tiny sizes on the CPU, to check its code (its times mean nothing),
and writes its JSON elsewhere.

Shared modules: :mod:`benchmarks.scene` (random Gaussians filling the frustum),
:mod:`benchmarks.timing` (CUDA events; the host clock where there are none),
:mod:`benchmarks.peers` (gsplat, Faster-GS, gswarp and nvdiffrast where importable, and
the torch renderers the step benchmarks drive) and :mod:`benchmarks.results` (the JSON
files and their markdown tables). A benchmark module imports torch, the peers and the
plugins inside its functions, so ``--help`` and ``report`` load none of them.
"""
