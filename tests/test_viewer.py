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
import sys
import tempfile
import time
import urllib.error
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


def test_viewer_lenses_place_the_focal_length():
    from arc_warp import Distortion
    from arc_warp_train.datasets import View
    from arc_warp_train.viewer import Lens

    q, position = (1.0, 0.0, 0.0, 0.0), (0.0, 0.0, -3.0)
    cam = camera_from_viser(q, position, np.radians(50.0), 64 / 48, 64, Lens.fisheye(180.0))
    # equidistant: the long side's half width is 90 degrees from the axis
    assert cam.model == "fisheye" and cam.distortion is None and cam.fx == pytest.approx(32.0 / (np.pi / 2))
    lens = Distortion(k1=0.03, k2=-0.01)
    view = View("v", np.zeros((18, 24, 3), np.float32), np.array([[10.0, 0, 12], [0, 10, 9], [0, 0, 1]]),
                np.eye(4), "fisheye", lens)
    cam = camera_from_viser(q, position, np.radians(50.0), 4 / 3, 48, Lens.of_view(view))
    assert (cam.model, cam.distortion, cam.fx, cam.width, cam.height) == ("fisheye", lens, 20.0, 48, 36)
    with pytest.raises(ValueError, match="field of view"):
        Lens.fisheye(0.0)


def test_viewer_camera_menu_renders_the_chosen_lens(tmp_path, capsys):
    """The side panel's camera menu switches the render to the lens; a lens that folds
    inside the window's corners falls back to the pinhole with one note."""
    from types import SimpleNamespace

    from arc_warp import Distortion
    from arc_warp.cli import load_gaussians
    from arc_warp_train.viewer import GaussianSource, Lens, Viewer

    _scene(tmp_path / "s.ply")
    lenses = {"pinhole": None, "fisheye": Lens.fisheye(180.0), "folding": Lens("pinhole", Distortion(k1=-0.5), 0.5)}
    viewer = Viewer(GaussianSource(load_gaussians(str(tmp_path / "s.ply"))), port=_free_port(), max_size=48,
                    device="cpu", lenses=lenses, camera="fisheye")
    try:
        arrays = viewer._arrays(viewer.source.get()[0])
        handle = SimpleNamespace(wxyz=(1.0, 0.0, 0.0, 0.0), position=(0.0, 0.3, -2.5), fov=np.radians(40.0),
                                 aspect=1.0)
        shots = {}
        for name in lenses:
            viewer.camera.value = name
            shots[name] = viewer._render(arrays, handle)
        # the bar (2 units wide at 2.5 away: 44 degrees) overfills the 40 degree pinhole and
        # spans a quarter of the 180 degree fisheye, in its middle
        columns = {name: np.nonzero(_red_mask(shot.astype(np.int16)).any(axis=0))[0] for name, shot in shots.items()}
        assert columns["pinhole"].min() == 0 and columns["pinhole"].max() == 47
        assert 14 <= columns["fisheye"].min() and columns["fisheye"].max() <= 33, columns["fisheye"]
        np.testing.assert_array_equal(shots["folding"], shots["pinhole"])
        viewer._render(arrays, handle)
        assert capsys.readouterr().out.count("camera 'folding' cannot draw this window") == 1
        with pytest.raises(ValueError, match="not one of the viewer's lenses"):
            Viewer(GaussianSource(), port=_free_port(), lenses=lenses, camera="ortho")
    finally:
        viewer.close()


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


def test_train_viewer_offers_the_captures_lens(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="arc-warp train needs torch")
    pytest.importorskip("pycolmap", reason="COLMAP models need pycolmap (arc-warp[colmap])")
    import arc_warp_train.viewer as viewer_module
    from arc_warp.cli import main
    from arc_warp_train.datasets import load_dataset
    from arc_warp_train.synthetic import make_fisheye_capture

    made, real = [], viewer_module.Viewer
    monkeypatch.setattr(viewer_module, "Viewer", lambda *a, **kw: made.append(kw["lenses"]) or real(*a, **kw))
    make_fisheye_capture(str(tmp_path / "d"), num_views=3, width=16, height=12, num_gaussians=60, device="cpu")
    assert main(["train", str(tmp_path / "d"), "-o", str(tmp_path / "o"), "--steps", "1", "--sh-degree", "0",
                 "--device", "cpu", "--threads", "1", "--no-progress", "--viewer", "--viewer-port",
                 str(_free_port())]) == 0
    first = load_dataset(str(tmp_path / "d")).train[0]
    assert made == [{"pinhole": None, "capture (fisheye + distortion)": viewer_module.Lens.of_view(first)}]


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


# ------------------------------------------------------------------ network hardening

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [ROOT, os.path.join(ROOT, "plugins"), os.path.join(ROOT, "apps"),
     os.environ.get("PYTHONPATH", "")])}


def _other_address():
    """A non-loopback IPv4 address of this machine, or None."""
    import ipaddress

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # UDP: picks the outgoing interface, sends nothing
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


def _http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def served(tmp_path):
    """A viewer of a tiny scene with its default host, on a free port."""
    _scene(tmp_path / "s.ply")
    viewer = view_ply(str(tmp_path / "s.ply"), port=_free_port(), max_size=32, device="cpu")
    yield viewer
    viewer.close()


def test_viewer_serves_this_machine_only_by_default(served):
    assert served.server.get_host() == "127.0.0.1"
    assert _http_status(f"http://127.0.0.1:{served.port}/") == 200
    other = _other_address()
    if other is None:
        pytest.skip("this machine has no non-loopback address to try")
    with pytest.raises(OSError):  # refused: nothing listens there
        socket.create_connection((other, served.port), timeout=5).close()


def _upgrade(port, origin=None, host=None):
    """Open the viser websocket on 127.0.0.1:`port` with this Origin and Host header;
    returns the HTTP status of the handshake (101 when accepted)."""
    import viser
    from websockets.exceptions import InvalidStatus

    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        with ws_client.connect(f"ws://{host or f'127.0.0.1:{port}'}", sock=sock, origin=origin,
                               subprotocols=[f"viser-v{viser.__version__}"], open_timeout=10):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def test_cross_origin_websocket_upgrades_are_refused(served):
    port = served.port
    assert _upgrade(port, origin="http://evil.example") == 403
    assert _upgrade(port, origin=f"http://evil.example:{port}") == 403
    # DNS rebinding: evil.example resolved to 127.0.0.1, so the page is same-origin with it.
    assert _upgrade(port, origin=f"http://evil.example:{port}",
                    host=f"evil.example:{port}") == 403
    assert _upgrade(port, origin=f"http://127.0.0.1:{port}") == 101  # the viewer's page
    assert _upgrade(port, origin=f"http://localhost:{port}", host=f"localhost:{port}") == 101
    assert _upgrade(port) == 101  # not a browser: no Origin header


def test_busy_port_is_an_error_not_the_next_port(tmp_path):
    _scene(tmp_path / "s.ply")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        viewer = None
        try:
            with pytest.raises(ValueError, match=rf"^port {port}: the port is in use on "
                                                 r"127.0.0.1; pick another port, or port 0"):
                viewer = view_ply(str(tmp_path / "s.ply"), port=port, device="cpu")
        finally:
            if viewer is not None:
                viewer.close()


def test_client_errors_are_logged_without_traceback(served, caplog):
    import logging

    for request in (b"", b"GARBAGE\r\n\r\n"):  # closed before a request; not HTTP
        with socket.create_connection(("127.0.0.1", served.port)) as s:
            s.sendall(request)
            time.sleep(0.3)
    time.sleep(0.5)
    logged = [r for r in caplog.records if r.name.startswith("websockets")]
    assert not [r for r in logged if r.exc_info], [r.getMessage() for r in logged]
    try:
        raise ConnectionResetError("peer gone")
    except ConnectionResetError:
        logging.getLogger("websockets.server").error("connection handler failed",
                                                     exc_info=True)
    record = caplog.records[-1]
    assert record.exc_info is None
    assert record.getMessage() == "connection handler failed: ConnectionResetError('peer gone')"


def _cli(args, timeout=60):
    return subprocess.run([sys.executable, "-m", "arc_warp.cli", *args], env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case", ["view port 70000", "view bad host", "view busy port",
                                  "view host of another machine", "train viewer port 70000",
                                  "train viewer busy port"])
def test_bad_address_fails_at_once_in_one_line(case, tmp_path):
    _scene(tmp_path / "s.ply")
    if case.startswith("train"):  # a real dataset: the viewer starts after it is read
        pytest.importorskip("torch", reason="arc-warp train needs torch")
        from arc_warp_train.synthetic import make_synthetic_dataset

        make_synthetic_dataset(str(tmp_path / "d"), num_train=2, num_test=1, width=16,
                               height=16, num_gaussians=40, device="cpu")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    args, expected = {
        "view port 70000": (["--port", "70000"], "argument --port: expected a port number "
                            "in 0..65535 (0: any free port), got '70000'"),
        "view bad host": (["--host", "no-such-host.invalid"],
                          "--host no-such-host.invalid: not a host name or address this "
                          "machine can listen on"),
        "view busy port": (["--port", str(busy.getsockname()[1])],
                           f"--port {busy.getsockname()[1]}: the port is in use on 127.0.0.1"),
        "view host of another machine": (["--host", "192.0.2.1"],  # TEST-NET-1
                                         "--host 192.0.2.1: not an address of this machine"),
        "train viewer port 70000": (["--viewer-port", "70000"],
                                    "argument --viewer-port: expected a port number"),
        "train viewer busy port": (["--viewer-port", str(busy.getsockname()[1])],
                                   f"--viewer-port {busy.getsockname()[1]}: the port is in use"),
    }[case]
    with busy:
        if case.startswith("train"):
            argv = ["train", str(tmp_path / "d"), "-o", str(tmp_path / "o"), "--steps", "2",
                    "--init-points", "30", "--device", "cpu", "--no-progress", "--viewer"] + args
        else:
            argv = ["view", str(tmp_path / "s.ply"), "--device", "cpu"] + args
        try:
            proc = _cli(argv)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"arc-warp {' '.join(argv)} hung") from None
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert expected in proc.stderr.strip().splitlines()[-1], proc.stderr


@pytest.mark.timeout(120)
def test_view_port_0_exposed_host_warns_and_stops_cleanly(tmp_path):
    """`--port 0` takes a free port and prints it; `--host 0.0.0.0` exposes the viewer and
    says so; stray connections and Ctrl-C print no traceback."""
    import signal

    _scene(tmp_path / "s.ply")
    proc = subprocess.Popen([sys.executable, "-m", "arc_warp.cli", "view",
                             str(tmp_path / "s.ply"), "--port", "0", "--host", "0.0.0.0",
                             "--device", "cpu", "--max-size", "16"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "arc-warp view: serving" not in line and proc.poll() is None:
            line = proc.stdout.readline()  # after viser's own banner
        assert " at http://localhost:" in line and line.endswith("(Ctrl-C stops)\n"), line
        port = int(line.split("http://localhost:")[1].split()[0])
        assert port > 0
        # First (viser quiets websockets' log once it has served a page): a connection
        # closed before its request, as browsers' speculative ones are.
        with socket.create_connection(("127.0.0.1", port)):
            pass
        time.sleep(0.5)
        assert _http_status(f"http://127.0.0.1:{port}/") == 200
        other = _other_address()
        if other is not None:
            assert _http_status(f"http://{other}:{port}/") == 200
        import viser

        ws = ws_client.connect(f"ws://127.0.0.1:{port}", open_timeout=10,
                               subprotocols=[f"viser-v{viser.__version__}"])
        ws.recv(timeout=10)
        ws.socket.close()  # a client that vanishes without a closing handshake
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "warning: --host 0.0.0.0: the viewer is reachable from other machines" in err
