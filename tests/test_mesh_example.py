"""The fit_mesh example runs end to end (tiny settings) and improves the fit."""

import pytest

pytest.importorskip("PIL", reason="the example writes PNGs with pillow")
pytest.importorskip("matplotlib", reason="the example's target texture ships with matplotlib")

from arc_warp_torch.examples import fit_mesh  # noqa: E402


def test_fit_mesh_runs(tmp_path):
    curve = fit_mesh.main(["--res", "24", "--tex", "16", "--views", "2", "--steps", "25", "25", "--out",
                           str(tmp_path)])
    colour = [p for _, stage, p in curve if stage == "colour"]
    shape = [p for _, stage, p in curve if stage == "shape"]
    assert colour[-1] > colour[0] + 5 and shape[-1] > shape[0]  # both stages learn
    for name in ("target.png", "before.png", "after.png"):
        assert (tmp_path / name).stat().st_size > 0
