"""One 3DGS training iteration (forward + backward + Adam) against gsplat (needs CUDA).

Same scene as bench_splat.py (1M Gaussians, 1920x1080, SH degree 3), parameters
stored as in 3DGS training (log-scales, logit-opacities, raw quaternions, SH
coefficients) with activations in torch, an L1 loss against a fixed target image,
and torch.optim.Adam with the usual per-parameter learning rates. The step is
timed with CUDA events after warm-up (median); arc_warp runs through
``arc_warp_torch.rasterization`` with reduce="arc" and gsplat through
``gsplat.rasterization`` (unpacked and packed).

Usage::

    python benchmarks/bench_train_step.py [--n 1000000] [--json out.json]
"""

import argparse
import json
import sys

import torch

from bench_splat import HEIGHT, SH_DEGREE, WIDTH, _torch_median_ms, make_scene

LRS = {"means": 1.6e-4, "quats": 1e-3, "log_scales": 5e-3, "logit_opacities": 5e-2, "sh": 2.5e-3}


def make_params(scene):
    p = {
        "means": torch.tensor(scene["means"], device="cuda"),
        "quats": torch.tensor(scene["quats"], device="cuda"),
        "log_scales": torch.log(torch.tensor(scene["scales"], device="cuda")),
        "logit_opacities": torch.logit(torch.tensor(scene["opacities"], device="cuda")),
        "sh": torch.tensor(scene["sh"], device="cuda"),
    }
    for v in p.values():
        v.requires_grad_(True)
    return p


def median_step_ms(render, scene, target, reps):
    params = make_params(scene)
    opt = torch.optim.Adam([{"params": [v], "lr": LRS[k]} for k, v in params.items()], eps=1e-15)
    cam = scene["camera"]
    viewmats = torch.tensor(cam.world_to_camera, dtype=torch.float32, device="cuda")[None]
    Ks = torch.tensor(cam.K, dtype=torch.float32, device="cuda")[None]

    def step():
        img = render(
            params["means"], torch.nn.functional.normalize(params["quats"], dim=-1),
            torch.exp(params["log_scales"]), torch.sigmoid(params["logit_opacities"]), params["sh"],
            viewmats, Ks,
        )
        loss = (img - target).abs().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return _torch_median_ms(step, reps, torch)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_train_step needs a CUDA GPU", file=sys.stderr)
        return 2
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    from arc_warp_torch import rasterization as arc_rasterization

    scene = make_scene(args.n)
    target = torch.rand(1, HEIGHT, WIDTH, 3, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    variants = {
        "arc_warp": lambda *a: arc_rasterization(*a, WIDTH, HEIGHT, sh_degree=SH_DEGREE, reduce="arc")[0],
    }
    try:
        from gsplat import rasterization as gs_rasterization

        for packed in (False, True):
            variants["gsplat" + ("_packed" if packed else "")] = lambda *a, packed=packed: gs_rasterization(
                *a, WIDTH, HEIGHT, sh_degree=SH_DEGREE, packed=packed, rasterize_mode="classic"
            )[0]
    except Exception as e:  # noqa: BLE001 - the peer is optional
        print(f"# gsplat unavailable: {e}")
    results = {name: median_step_ms(fn, scene, target, args.reps) for name, fn in variants.items()}
    # The adapter keeps Warp's freed memory pooled (see arc_warp_torch POOL_RELEASE_FRACTION);
    # CUDA's default, which returns it at every sync, for comparison:
    wp.set_mempool_release_threshold("cuda", 0)
    results["arc_warp (pool released per sync)"] = median_step_ms(variants["arc_warp"], scene, target, args.reps)
    print(f"# training step (forward + backward + Adam), N={args.n}, {WIDTH}x{HEIGHT}, SH {SH_DEGREE}, "
          f"{torch.cuda.get_device_name()}")
    for name, ms in results.items():
        print(f"{name:36s} {ms:8.3f} ms")
    peers = [v for k, v in results.items() if k.startswith("gsplat")]
    if peers:
        print(f"arc_warp / best gsplat: {results['arc_warp'] / min(peers):.2f}x (< 1 means arc_warp is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "step_ms": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
