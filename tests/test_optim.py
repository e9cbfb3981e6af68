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


# One launch updates every parameter: segments of different lengths and row widths (an empty
# one too), in groups with their own lr / betas / eps, some gradients None, a parameter grown
# between steps (densification). A mix-up of segments, pointers, per-parameter scalars or
# row widths moves some tensor by a step's size (1e-3 .. 5e-2), far beyond the tolerances.
MIXED = [(37, 3), (37, 4), (37,), (37, 1, 3), (37, 15, 3), (37, 1), (37, 2)]
MIXED_GROUPS = [({"lr": 1e-2}, [0, 1]), ({"lr": 5e-2, "betas": (0.8, 0.99)}, [2]),
                ({"lr": 2.5e-3, "eps": 1e-8}, [3, 4, 5, 6])]


@pytest.fixture(params=[
    pytest.param(("cpu", 1), id="cpu_span1"),  # the CUDA layout: one float per thread
    pytest.param(("cpu", 3), id="cpu_span3"),  # blocks that end mid-row
    pytest.param(("cpu", None), id="cpu"),
    pytest.param(("cuda", None), id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def layout(request, monkeypatch):
    """The device of a test and, on the CPU, the floats per kernel thread (CPU_SPAN)."""
    from arc_warp_torch import optim

    device, span = request.param
    if span is not None:
        monkeypatch.setattr(optim, "CPU_SPAN", span)
    return device


def _tensor(values, device):
    return torch.tensor(values, dtype=torch.float32, device=device)


def _mixed(rng, shapes, device, **kwargs):
    """(params, optimizer): SparseGaussianAdam over parameters of ``shapes`` in MIXED_GROUPS."""
    params = [_tensor(rng.normal(size=s), device).requires_grad_(True) for s in shapes]
    groups = [dict(options, params=[params[k] for k in ks]) for options, ks in MIXED_GROUPS]
    return params, SparseGaussianAdam(groups, lr=0.0, eps=1e-15, **kwargs)


def _grad_pattern(k, it):
    """Whether parameter k has a gradient at step it (each misses some steps; 6 misses the
    first two, so its state starts later)."""
    return not ((k + it) % 4 == 3 or (k == 6 and it < 2))


def _grow(opt, params, k, extra):
    """Replace parameter k by itself with its first ``extra`` rows appended, its moments
    zero-padded (INRIA's cat_tensors_to_optimizer)."""
    old = params[k]
    new = torch.cat([old.detach(), old.detach()[:extra]]).requires_grad_(True)
    for group in opt.param_groups:
        group["params"] = [new if p is old else p for p in group["params"]]
    state = opt.state.pop(old, None)
    if state:
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = torch.cat([state[key], torch.zeros_like(state[key][:extra])])
        opt.state[new] = state
    params[k] = new


@pytest.mark.parametrize("capturable", [False, True], ids=["host_steps", "capturable"])
def test_one_launch_dense_equals_torch_adam_on_mixed_parameters(rng, layout, monkeypatch, capturable):
    """Dense steps with bias correction over mixed parameters (and an empty one, and one of
    other row count) are torch.optim.Adam steps, in one launch per step; ``capturable``
    keeps the step counts on the parameters' device, where the kernel reads them."""
    import warp as wp

    shapes = MIXED[:6] + [(0, 3)]  # an empty segment among the others
    ours, opt = _mixed(rng, shapes, layout, bias_correction=True, capturable=capturable)
    ours.append(_tensor(rng.normal(size=(11, 2)), layout).requires_grad_(True))
    opt.param_groups[0]["params"].append(ours[-1])  # 11 rows where the others have 37
    ref = [p.detach().clone().requires_grad_(True) for p in ours]
    ref_opt = torch.optim.Adam([dict(g, capturable=False, params=[ref[next(i for i, q in enumerate(ours) if q is p)]
                                                                  for p in g["params"]]) for g in opt.param_groups])
    launches = []
    launch = wp.Launch.launch
    monkeypatch.setattr(wp.Launch, "launch", lambda self, *a, **k: (launches.append(self), launch(self, *a, **k)))
    for it in range(7):
        if it == 4:
            _grow(opt, ours, 4, 5)
            _grow(ref_opt, ref, 4, 5)
        for o, r in zip(opt.param_groups, ref_opt.param_groups):
            o["lr"] = r["lr"] = o["lr"] * 0.9  # a schedule changes it every step
        for k, (p, q) in enumerate(zip(ours, ref)):
            g = _tensor(rng.normal(size=p.shape), layout) if _grad_pattern(k, it) else None
            p.grad, q.grad = g, None if g is None else g.clone()
        launches.clear()
        opt.step()
        ref_opt.step()
        assert len(launches) == 1  # every parameter of every group
    for k, (p, q) in enumerate(zip(ours, ref)):
        # capturable: the bias corrections in float32 on the device (test_capturable_steps_read_...)
        torch.testing.assert_close(p, q, rtol=2e-6, atol=5e-6 if capturable else 1e-6,
                                   msg=f"parameter {k} {list(p.shape)}")
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], ref_opt.state[q][key], rtol=2e-6, atol=1e-7,
                                       msg=f"{key} of parameter {k}")
        assert float(opt.state[p]["step"]) == float(ref_opt.state[q]["step"]) > 0
        assert opt.state[p]["step"].device == (p.device if capturable else torch.device("cpu"))


def _sparse_reference(state, group, g, vis, bias_correction):
    """One sparse Adam step in float64 numpy on the visible rows of state = (p, m, v, t)."""
    beta1, beta2 = group["betas"]
    p64, m, v, t = state
    t += 1
    m[vis] = beta1 * m[vis] + (1 - beta1) * g[vis]
    v[vis] = beta2 * v[vis] + (1 - beta2) * g[vis] ** 2
    step_size, bias2_sqrt = group["lr"], 1.0
    if bias_correction:
        step_size, bias2_sqrt = group["lr"] / (1 - beta1 ** t), np.sqrt(1 - beta2 ** t)
    p64[vis] -= step_size * m[vis] / (np.sqrt(v[vis]) / bias2_sqrt + group["eps"])
    return p64, m, v, t


@pytest.mark.parametrize("capturable", [False, True], ids=["host_steps", "capturable"])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_one_launch_sparse_follows_float64_reference_on_mixed_parameters(rng, layout, bias_correction, capturable):
    """Sparse steps over mixed row widths (1, 2, 3, 4, 45) follow the sparse rule per row;
    invisible rows keep their parameter and moments bit for bit; N grows mid-run."""
    params, opt = _mixed(rng, MIXED, layout, bias_correction=bias_correction, capturable=capturable)
    ref = {}  # parameter index -> (p, m, v, t) in float64
    n = MIXED[0][0]
    for it in range(7):
        if it == 4:  # densify every parameter: N 37 -> 42
            for k in range(len(params)):
                _grow(opt, params, k, 5)
                if k in ref:
                    p64, m, v, t = ref[k]
                    ref[k] = (np.concatenate([p64, p64[:5]]), np.concatenate([m, 0 * m[:5]]),
                              np.concatenate([v, 0 * v[:5]]), t)
            n += 5
        for group in opt.param_groups:
            group["lr"] *= 0.9
        grads = {}
        for k, p in enumerate(params):
            g = rng.normal(size=p.shape) * 10 ** rng.uniform(-3, 1)
            p.grad = _tensor(g, layout) if _grad_pattern(k, it) else None
            if p.grad is not None:
                grads[k] = p.grad.double().cpu().numpy()
        vis = rng.uniform(size=n) < 0.6
        visible = torch.tensor(vis, device=layout)
        before = [(p.detach().clone(), {s: t.clone() for s, t in opt.state[p].items() if s != "step"})
                  for p in params]
        opt.step(visible, n)
        for k, p in enumerate(params):
            group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
            if k in grads:
                state = ref.get(k) or (before[k][0].double().cpu().numpy(), np.zeros(p.shape), np.zeros(p.shape), 0)
                ref[k] = _sparse_reference(state, group, grads[k], vis, bias_correction)
            hidden = ~visible
            assert torch.equal(p.detach()[hidden], before[k][0][hidden]), f"parameter {k}: invisible rows moved"
            for key, old in before[k][1].items():
                assert torch.equal(opt.state[p][key][hidden], old[hidden]), f"{key} of parameter {k}"
    for k, p in enumerate(params):
        p64, m, v, t = ref[k]
        state = opt.state[p]
        # float64 reference vs float32 kernel over 7 steps, gradients of 1e-3 .. 10
        np.testing.assert_allclose(p.detach().cpu().numpy(), p64, rtol=1e-5, atol=1e-6, err_msg=f"parameter {k}")
        np.testing.assert_allclose(state["exp_avg"].cpu().numpy(), m, rtol=1e-5, atol=1e-7, err_msg=f"exp_avg {k}")
        np.testing.assert_allclose(state["exp_avg_sq"].cpu().numpy(), v, rtol=1e-5, atol=1e-9,
                                   err_msg=f"exp_avg_sq {k}")
        assert float(state["step"]) == t


def test_launches_split_by_max_segments_give_the_same_bits(monkeypatch):
    """More parameters than one launch takes (MAX_SEGMENTS) run as several launches, with
    the same results bit for bit; a steady loop binds its tensors once."""
    from arc_warp_torch import optim

    results, binds = [], []
    bind = SparseGaussianAdam._bind
    monkeypatch.setattr(SparseGaussianAdam, "_bind", lambda self, *a: (binds.append(1), bind(self, *a))[1])
    for max_segments in (optim.MAX_SEGMENTS, 3):
        monkeypatch.setattr(optim, "MAX_SEGMENTS", max_segments)
        binds.clear()
        params, opt = _mixed(np.random.default_rng(5), MIXED, "cpu", bias_correction=True)
        grads = [torch.tensor(np.random.default_rng(k).normal(size=s), dtype=torch.float32)
                 for k, s in enumerate(MIXED)]
        for it in range(4):
            for p, g in zip(params, grads):
                p.grad = g
            opt.step(torch.arange(37) % 3 != 0, 37) if it % 2 else opt.step()
        assert len(opt._bound) == -(-len(MIXED) // max_segments)
        assert len(binds) == 4  # dense and sparse alternate: each step rebinds
        for _ in range(3):
            opt.step()
        assert len(binds) == 5  # then steady: once
        results.append([t.clone() for p in params for t in (p.detach(), *opt.state[p].values())])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_step_checks_edited_state(rng):
    """State edited out of step with its parameter (a densification bug) raises, naming the
    tensor, before anything is updated."""
    params = _params(rng)
    opt = SparseGaussianAdam(_groups(params), lr=1e-2, eps=1e-15)
    for k in SHAPES:
        params[k].grad = torch.ones(SHAPES[k])
    opt.step()
    state = opt.state[params["means"]]
    state["exp_avg"] = state["exp_avg"][:49]  # a view: same memory, fewer rows
    before = {k: v.detach().clone() for k, v in params.items()}
    with pytest.raises(ValueError, match="exp_avg of a parameter"):
        opt.step()
    assert all(torch.equal(params[k].detach(), before[k]) for k in SHAPES)
    assert float(opt.state[params["sh"]]["step"]) == 1


def test_step_without_gradients_does_nothing(rng):
    params = _params(rng)
    opt = SparseGaussianAdam(_groups(params), lr=1e-2, eps=1e-15)
    opt.step()
    opt.step(torch.ones(50, dtype=torch.bool), 50)
    assert len(opt.state) == 0


def test_capturable_steps_read_the_count_where_it_is_kept(rng):
    """The capturable kernel takes the bias corrections from the step count in memory: a
    count edited between steps (as a loaded checkpoint sets it) is the one used, as
    torch.optim.Adam uses it."""
    ours = _params(rng)
    ref = {k: v.detach().clone().requires_grad_(True) for k, v in ours.items()}
    opt = SparseGaussianAdam(_groups(ours), lr=0.0, eps=1e-15, bias_correction=True, capturable=True)
    ref_opt = torch.optim.Adam(_groups(ref), lr=0.0, eps=1e-15)
    for it in range(4):
        if it == 2:
            for k in SHAPES:
                opt.state[ours[k]]["step"].fill_(3.0)  # 1 - beta^t changes ~3x from t = 2 to 4
                ref_opt.state[ref[k]]["step"].fill_(3.0)
        grads = _grads(rng)
        for k in SHAPES:
            ours[k].grad, ref[k].grad = grads[k].clone(), grads[k].clone()
        opt.step()
        ref_opt.step()
    for k in SHAPES:
        # 1 - beta2^t in float32 on the device (as torch's capturable Adam works it out),
        # against float64 on the host: ~1e-5 of the update (lr 1e-2 .. 5e-2); a wrong count
        # changes the update by tens of percent
        torch.testing.assert_close(ours[k], ref[k], rtol=2e-6, atol=5e-6)
        assert float(opt.state[ours[k]]["step"]) == 5


def test_a_step_inside_a_cuda_graph_capture_needs_capturable(rng, monkeypatch):
    """While a CUDA graph capture records it (faked here: a CPU build cannot capture), a
    step with host step counts raises before anything is updated; a capturable step whose
    count was loaded as float64 raises too (converting it could not be replayed), and the
    first step outside the capture converts it."""
    params = _params(rng)
    for k in SHAPES:
        params[k].grad = torch.ones(SHAPES[k])
    before = {k: v.detach().clone() for k, v in params.items()}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="capturable=True"):
        SparseGaussianAdam(_groups(params), lr=1e-2, eps=1e-15).step()
    assert all(torch.equal(params[k].detach(), before[k]) for k in SHAPES)

    opt = SparseGaussianAdam(_groups(params), lr=1e-2, eps=1e-15, capturable=True)
    opt.step()  # a new state is made where the kernel reads it
    opt.state[params["means"]]["step"] = torch.tensor(1.0, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="outside the CUDA graph capture"):
        opt.step()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    opt.step()
    step = opt.state[params["means"]]["step"]
    assert step.dtype == torch.float32 and float(step) == 2


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_tensor_learning_rates_are_read_where_they_are_kept(rng, device, sparse):
    """A capturable optimizer whose groups hold their lr as device tensors steps as the one
    whose groups hold the same floats, bitwise; a value written into the tensor in place
    between steps (a schedule: what a CUDA graph replay reads) is the one the next step
    uses."""
    ours = _params(rng, device)
    ref = {k: v.detach().clone().requires_grad_(True) for k, v in ours.items()}
    lrs = {k: torch.tensor(lr, dtype=torch.float32, device=device) for k, lr in LRS.items()}
    opt = SparseGaussianAdam([{"params": [v], "lr": lrs[k]} for k, v in ours.items()], lr=0.0, eps=1e-15,
                             bias_correction=True, capturable=True)
    ref_opt = SparseGaussianAdam(_groups(ref), lr=0.0, eps=1e-15, bias_correction=True, capturable=True)
    visible = torch.tensor(rng.random(50) < 0.6, device=device) if sparse else None
    for it in range(4):
        if it == 2:  # the means' rate decays; the tensor is written in place
            lrs["means"].fill_(LRS["means"] * 0.3)
            ref_opt.param_groups[0]["lr"] = float(lrs["means"])
        grads = _grads(rng, device)
        for k in SHAPES:
            ours[k].grad, ref[k].grad = grads[k].clone(), grads[k].clone()
        for o in (opt, ref_opt):
            o.step(visible, 50) if sparse else o.step()
    for k in SHAPES:
        assert torch.equal(ours[k], ref[k]), k


def test_tensor_learning_rates_need_the_capturable_kernel(rng):
    """A tensor lr on a host-count optimizer raises TypeError, and one of another dtype
    ValueError, before anything (a step count included) is updated."""
    params = _params(rng)
    for k in SHAPES:
        params[k].grad = torch.ones(SHAPES[k])
    before = {k: v.detach().clone() for k, v in params.items()}
    host = SparseGaussianAdam([{"params": [v], "lr": torch.tensor(1e-2)} for v in params.values()], lr=0.0,
                              eps=1e-15)
    with pytest.raises(TypeError, match="capturable=True"):
        host.step()
    double = SparseGaussianAdam([{"params": [v], "lr": torch.tensor(1e-2, dtype=torch.float64)}
                                 for v in params.values()], lr=0.0, eps=1e-15, capturable=True)
    with pytest.raises(ValueError, match="one float32"):
        double.step()
    for opt in (host, double):
        assert all(float(state["step"]) == 0 for state in opt.state.values())
    assert all(torch.equal(params[k].detach(), before[k]) for k in SHAPES)


@pytest.mark.parametrize("count", [1, 2, 3, 10, 1000, 10**6])
def test_capturable_bias_corrections_match_the_hosts_to_float32_rounding(rng, count):
    """The capturable kernel works out 1 - beta^t from the count on the device to a few
    float32 ulps of the host's float64 figure: at small counts, where 1 - pow(beta, t) in
    float32 is off by ~1e-5 (it rounds beta first: 1 - float32(0.999)), and at counts
    whose beta^t underflows."""
    grads = torch.tensor(rng.normal(size=(2, 64)), dtype=torch.float32)
    updates = []
    for capturable in (True, False):
        p = torch.zeros(64, requires_grad=True)
        opt = SparseGaussianAdam([p], lr=1e-3, eps=1e-15, bias_correction=True, capturable=capturable)
        p.grad = grads[0].clone()
        opt.step()  # makes the state; then the count and moments of `count` - 1 steps, p at 0
        state = opt.state[p]
        state["step"].fill_(count - 1)
        state["exp_avg"].copy_(grads[0] * 0.3)
        state["exp_avg_sq"].copy_(grads[0] ** 2 * 0.2)
        with torch.no_grad():
            p.zero_()
        p.grad = grads[1].clone()
        opt.step()
        updates.append(p.detach().clone())  # from 0: the update at full float32 precision
    # a few float32 ulps (1.2e-7 each) of the bias corrections and the update's own
    # rounding; beta2's rounding in pow made 6.5e-6 of the update at count 1
    torch.testing.assert_close(updates[0], updates[1], rtol=1e-6, atol=0)
