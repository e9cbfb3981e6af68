"""`arc-warp view` in a real headless browser: Chromium loads the viser page, the first
frame rendered by arc_warp arrives, and dragging the mouse orbits the camera, which
changes the picture. Chromium is driven over the DevTools protocol with a small
websocket client; the test skips when Chromium is absent (outside CI)."""

import base64
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest

pytest.importorskip("viser", reason="the viewer needs viser (arc-warp[viewer])")
PIL_Image = pytest.importorskip("PIL.Image", reason="screenshots are decoded with pillow")
ws_client = pytest.importorskip("websockets.sync.client", reason="CDP needs websockets")

from arc_warp.ply import GaussianPly, write_ply  # noqa: E402
from arc_warp_train.viewer import camera_from_viser, view_ply  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-unsafe-swiftshader", "--window-size=800,600"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what, probe, seconds=30.0, step=0.2):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = probe()
        if value is not None and value is not False:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


class DevTools:
    """Minimal Chrome DevTools protocol client on one page target."""

    def __init__(self, url):
        self.ws, self.next_id = ws_client.connect(url, max_size=None, open_timeout=20), 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def screenshot(self) -> np.ndarray:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        return np.asarray(PIL_Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"),
                          np.int16)

    def drag(self, x0, y0, x1, y1, steps=10):
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=x0, y=y0, button="left",
                  clickCount=1)
        for k in range(1, steps + 1):
            self.call("Input.dispatchMouseEvent", type="mouseMoved", button="left", buttons=1,
                      x=x0 + (x1 - x0) * k / steps, y=y0 + (y1 - y0) * k / steps)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x1, y=y1, button="left",
                  clickCount=1)


def _red_mask(shot):
    """Pixels of the scene's pure red (viser's own GUI has none this saturated)."""
    r, g, b = shot[..., 0], shot[..., 1], shot[..., 2]
    return (r > 120) & (g < 60) & (b < 60)


def _scene(path):
    """A red bar along x beside a red ball: asymmetric, so orbiting changes the picture."""
    rng = np.random.default_rng(0)
    bar = np.stack([np.linspace(-1, 1, 60), np.zeros(60), np.zeros(60)], 1)
    ball = rng.normal(0, 0.15, (40, 3)) + [0.0, 0.8, 0.3]
    means = np.concatenate([bar, ball])
    n = len(means)
    sh = np.zeros((n, 1, 3))
    sh[:, 0] = (np.array([1.0, 0.0, 0.0]) - 0.5) / 0.28209479177387814
    write_ply(path, GaussianPly.from_activated(means, np.tile([1.0, 0, 0, 0], (n, 1)),
                                               np.full((n, 3), 0.08), np.full(n, 0.95), sh))


def test_camera_from_viser_matches_look_at():
    from arc_warp import Camera

    ref = Camera.look_at((3.0, -2.0, 1.0), (0.0, 0.0, 0.0), (0.0, 0.0, 1.0), 50.0, 64, 48)
    c2w = np.linalg.inv(ref.world_to_camera)
    m = c2w[:3, :3]  # rotation -> wxyz (Shepperd, trace branch suffices for this pose)
    w = 0.5 * np.sqrt(1 + np.trace(m))
    q = [w, (m[2, 1] - m[1, 2]) / (4 * w), (m[0, 2] - m[2, 0]) / (4 * w),
         (m[1, 0] - m[0, 1]) / (4 * w)]
    cam = camera_from_viser(q, c2w[:3, 3], np.radians(50.0), 64 / 48, 64)
    np.testing.assert_allclose(cam.world_to_camera, ref.world_to_camera, atol=1e-9)
    assert (cam.width, cam.height) == (64, 48) and cam.fy == pytest.approx(ref.fy)


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="Chromium is not installed (apt-get install chromium)")
@pytest.mark.timeout(120)
def test_viewer_in_headless_chromium(tmp_path):
    assert CHROMIUM is not None, "CI must install Chromium (.ci/run does)"
    _scene(tmp_path / "s.ply")
    viewer = view_ply(str(tmp_path / "s.ply"), port=_free_port(), max_size=160, device="cpu",
                      host="127.0.0.1")
    debug_port = _free_port()
    browser = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--remote-debugging-port={debug_port}",
         f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def page_ws():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{debug_port}/json") as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
            except OSError:
                return None
            return pages[0]["webSocketDebuggerUrl"] if pages else None

        cdp = DevTools(_wait("Chromium's DevTools", page_ws))
        cdp.call("Page.enable")
        cdp.call("Page.navigate", url=f"http://127.0.0.1:{viewer.port}")
        _wait("the first frame to be sent", lambda: viewer.frames_sent > 0, seconds=60)
        before = _wait("the frame on screen", lambda: (lambda s: s if _red_mask(s).sum() > 200
                                                       else None)(cdp.screenshot()))
        sent = viewer.frames_sent
        cdp.drag(250, 300, 450, 260)
        _wait("a frame for the moved camera", lambda: viewer.frames_sent > sent, seconds=30)

        def changed():
            shot = cdp.screenshot()
            moved = (_red_mask(shot) != _red_mask(before)).sum()
            return shot if moved > 200 and _red_mask(shot).sum() > 100 else None

        _wait("the picture to change", changed)
    finally:
        browser.kill()
        browser.wait()
        viewer.close()


def test_train_viewer_publishes_model_and_stats(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="arc-warp train needs torch")
    import arc_warp_train.viewer as viewer_module
    from arc_warp.cli import main
    from arc_warp_train.synthetic import make_synthetic_dataset

    made = []

    class Recording(viewer_module.Viewer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(viewer_module, "Viewer", Recording)
    make_synthetic_dataset(str(tmp_path / "d"), num_train=2, num_test=1, width=16, height=16,
                           num_gaussians=40, device="cpu")
    assert main(["train", str(tmp_path / "d"), "-o", str(tmp_path / "o"), "--steps", "4",
                 "--init-points", "30", "--sh-degree", "1", "--eval-every", "4", "--device",
                 "cpu", "--threads", "1", "--no-progress", "--viewer", "--viewer-port",
                 str(_free_port())]) == 0
    (viewer,) = made
    gaussians, version = viewer.source.get()
    assert version >= 1 and gaussians["sh"].shape[1:] == (1, 3)  # SH degree 0 is active at step 4
    from arc_warp.ply import read_ply

    final = read_ply(str(tmp_path / "o" / "point_cloud.ply")).activated()
    np.testing.assert_allclose(gaussians["means"], final["means"])
    assert viewer._stats["step"].value == "4 / 4"
    assert viewer._stats["Gaussians"].value == str(len(final["means"]))
    assert viewer._stats["PSNR"].value.endswith("dB (training view)")


def test_view_command_checks_the_ply_before_serving(tmp_path):
    import argparse

    from arc_warp_train.viewer import add_view_parser

    parser = argparse.ArgumentParser(prog="arc-warp")
    add_view_parser(parser.add_subparsers(dest="command"))
    bad = tmp_path / "nan.ply"
    n = 4
    write_ply(bad, GaussianPly.from_activated(np.full((n, 3), np.nan), np.tile([1.0, 0, 0, 0], (n, 1)),
                                              np.full((n, 3), 0.1), np.full(n, 0.5),
                                              np.zeros((n, 1, 3))))
    args = parser.parse_args(["view", str(bad), "--port", str(_free_port()), "--device", "cpu"])
    with pytest.raises(ValueError, match="property x of vertex 0 is nan"):
        args.func(args)
