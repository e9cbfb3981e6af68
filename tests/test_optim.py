"""arc_warp_torch.SparseGaussianAdam: dense steps are torch.optim.Adam steps; sparse steps
leave invisible rows and their moments untouched and follow the sparse Adam of INRIA /
Taming 3DGS on visible rows (CPU)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="arc_warp_torch needs torch")

from arc_warp_torch import SparseGaussianAdam  # noqa: E402

SHAPES = {"means": (50, 3), "opacities": (50,), "sh": (50, 4, 3)}
LRS = {"means": 1e-2, "opacities": 5e-2, "sh": 2.5e-3}


def _params(rng, device="cpu"):
    return {k: torch.tensor(rng.normal(size=s), dtype=torch.float32, device=device, requires_grad=True)
            for k, s in SHAPES.items()}


def _grads(rng, device="cpu"):
    return {k: torch.tensor(rng.normal(size=s), dtype=torch.float32, device=device)
            for k, s in SHAPES.items()}


def _groups(params):
    return [{"params": [v], "lr": LRS[k], "name": k} for k, v in params.items()]


@pytest.mark.parametrize("sparse_all_visible", [False, True], ids=["dense", "sparse_all_visible"])
def test_dense_steps_equal_torch_adam(rng, sparse_all_visible, device):
    ours = _params(rng, device)
    ref = {k: v.detach().clone().requires_grad_(True) for k, v in ours.items()}
    opt = SparseGaussianAdam(_groups(ours), lr=0.0, eps=1e-15, bias_correction=True)
    ref_opt = torch.optim.Adam(_groups(ref), lr=0.0, eps=1e-15)
    for _ in range(6):
        grads = _grads(rng, device)
        for k in SHAPES:
            ours[k].grad, ref[k].grad = grads[k].clone(), grads[k].clone()
        if sparse_all_visible:
            opt.step(torch.ones(50, dtype=torch.bool, device=device), 50)
        else:
            opt.step()
        ref_opt.step()
    for k in SHAPES:
        # float32 round-off of one operation order against another: a few ulps of the
        # parameters (|p| < 5, ulp 4.8e-7) after 6 steps; the effect of one step is ~1e-3
        torch.testing.assert_close(ours[k], ref[k], rtol=2e-6, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            # moments of unit-scale gradients: within one float32 ulp of 1 (1.2e-7); a moment
            # near 0 after cancellation differs in relative terms only
            torch.testing.assert_close(opt.state[ours[k]][key], ref_opt.state[ref[k]][key],
                                       rtol=2e-6, atol=1e-7)
        assert float(opt.state[ours[k]]["step"]) == float(ref_opt.state[ref[k]]["step"]) == 6


def test_sparse_steps_touch_visible_rows_only(rng):
    params = _params(rng)
    opt = SparseGaussianAdam(_groups(params), lr=0.0, eps=1e-15)
    b1, b2, eps = 0.9, 0.999, 1e-15
    ref = {k: (v.detach().double().numpy().copy(), np.zeros(SHAPES[k]), np.zeros(SHAPES[k]))
           for k, v in params.items()}
    for _ in range(5):
        grads = _grads(rng)
        visible = torch.tensor(rng.uniform(size=50) < 0.6)
        before = {k: (v.detach().clone(), {s: t.clone() for s, t in opt.state[v].items() if s != "step"})
                  for k, v in params.items()}
        for k in SHAPES:
            params[k].grad = grads[k]
        opt.step(visible, visible.shape[0])
        vis = visible.numpy()
        for k in SHAPES:
            p, m, v = ref[k]
            g = grads[k].double().numpy()
            m[vis] = b1 * m[vis] + (1 - b1) * g[vis]
            v[vis] = b2 * v[vis] + (1 - b2) * g[vis] ** 2
            p[vis] -= LRS[k] * m[vis] / (np.sqrt(v[vis]) + eps)  # no bias correction
            # invisible rows: parameter and both moments bit-for-bit unchanged
            hidden = ~visible
            assert torch.equal(params[k].detach()[hidden], before[k][0][hidden])
            for key, old in before[k][1].items():
                assert torch.equal(opt.state[params[k]][key][hidden], old[hidden])
    for k in SHAPES:
        p, m, v = ref[k]
        # float64 reference vs float32 kernel over 5 steps
        np.testing.assert_allclose(params[k].detach().numpy(), p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(opt.state[params[k]]["exp_avg"].numpy(), m, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(opt.state[params[k]]["exp_avg_sq"].numpy(), v, rtol=1e-5, atol=1e-9)


def test_sparse_adam_checks_visibility(rng):
    params = _params(rng)
    opt = SparseGaussianAdam(_groups(params), lr=0.0, eps=1e-15)
    for k in SHAPES:
        params[k].grad = torch.ones(SHAPES[k])
    with pytest.raises(ValueError, match="visibility"):
        opt.step(torch.ones(49, dtype=torch.bool), 49)
    with pytest.raises(ValueError, match="N="):
        opt.step(torch.ones(50, dtype=torch.bool), 49)


def test_inria_module_exports_sparse_adam():
    from arc_warp_torch import inria

    assert inria.SparseGaussianAdam is SparseGaussianAdam
