"""arc_warp's 3DGS training application: datasets, losses, densification, the trainer,
demos and the `arc-warp train` / `arc-warp demo` subcommands.

An application on top of the core and the torch bridge: it may import both, and nothing
imports it. The package root imports nothing, so torch-free modules (`synthetic`,
`datasets`) load without torch; import the module you need, e.g.
``from arc_warp_train.trainer import TrainConfig, train``.
"""
