"""Live web viewer on viser: arc_warp renders on the server, the browser orbits.

Each connected browser gets its own camera; whenever it moves (or the scene changes) a
render thread draws the view with `arc_warp.render_gaussians` at most `max_size` pixels
on its long side and sends it as the browser's background image. Used by
`arc-warp view scene.ply` and `arc-warp train --viewer` (which publishes snapshots of
the model with the step, PSNR and Gaussian count).

Camera convention: viser's camera pose (wxyz, position) is camera-to-world with OpenCV
axes (+x right, +y down, +z forward), as arc_warp's; fov is vertical, in radians.
"""

import argparse
import math
import threading
import time

import numpy as np

VIEWER_HINT = "pip install -e '.[viewer]' (from the arc_warp checkout)"


def _quat_wxyz_to_rotmat(q) -> np.ndarray:
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def camera_from_viser(wxyz, position, fov_y: float, aspect: float, max_size: int):
    """An arc_warp Camera for a viser camera state, max_size pixels on its long side."""
    from arc_warp import Camera

    width, height = (max_size, max(1, round(max_size / aspect))) if aspect >= 1.0 else \
        (max(1, round(max_size * aspect)), max_size)
    c2w = np.eye(4)
    c2w[:3, :3] = _quat_wxyz_to_rotmat(wxyz)
    c2w[:3, 3] = position
    focal = 0.5 * height / math.tan(0.5 * fov_y)
    return Camera(focal, focal, 0.5 * width, 0.5 * height, width, height,
                  world_to_camera=np.linalg.inv(c2w))


class GaussianSource:
    """The scene the viewer shows: activated float32 arrays (means, quats, scales,
    opacities, sh (N,K,3)) that may be replaced while serving (`publish`)."""

    def __init__(self, gaussians: dict = None):
        self._lock = threading.Lock()
        self._gaussians, self.version = None, 0
        if gaussians is not None:
            self.publish(gaussians)

    def publish(self, gaussians: dict) -> None:
        with self._lock:
            self._gaussians = {k: np.ascontiguousarray(v, np.float32) for k, v in gaussians.items()}
            self.version += 1

    def get(self):
        with self._lock:
            return self._gaussians, self.version


class Viewer:
    """A viser server whose clients see `source` rendered by arc_warp.

    stats: text shown in the side panel, updated with `set_stats(name=value, ...)`.
    frames_sent counts background images sent (all clients). `close()` stops it."""

    def __init__(self, source: GaussianSource, port: int = 8080, host: str = "0.0.0.0",
                 max_size: int = 256, background=(0.0, 0.0, 0.0), device=None,
                 up=(0.0, 0.0, 1.0), look_at=(0.0, 0.0, 0.0), eye=None, stats=()):
        import viser
        import warp as wp

        self.wp, self.source, self.max_size = wp, source, int(max_size)
        self.device = wp.get_device(device)
        self.background = tuple(float(b) for b in background)
        self.server = viser.ViserServer(host=host, port=port, verbose=False)
        self.server.scene.set_up_direction(tuple(float(u) for u in up))
        self._eye, self._target, self._up = eye, look_at, up
        self._stats = {name: self.server.gui.add_text(name, initial_value="-", disabled=True)
                       for name in stats}
        self._dirty, self._lock = {}, threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self.frames_sent = 0
        self.server.on_client_connect(self._connect)
        self.server.on_client_disconnect(self._disconnect)
        self._thread = threading.Thread(target=self._loop, daemon=True, name="arc-warp-viewer")
        self._thread.start()

    @property
    def port(self) -> int:
        return self.server.get_port()

    def set_stats(self, **values) -> None:
        for name, value in values.items():
            self._stats[name].value = str(value)

    def refresh(self) -> None:
        """Redraw every client (call after `source.publish`)."""
        with self._lock:
            for cid in self._dirty:
                self._dirty[cid] = True
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.server.stop()

    def _connect(self, client) -> None:
        if self._eye is not None:
            with client.atomic():
                client.camera.up_direction = tuple(float(u) for u in self._up)
                client.camera.position = tuple(float(v) for v in self._eye)
                client.camera.look_at = tuple(float(v) for v in self._target)
        client.camera.on_update(lambda _cam: self._mark(client.client_id))
        self._mark(client.client_id)

    def _disconnect(self, client) -> None:
        with self._lock:
            self._dirty.pop(client.client_id, None)

    def _mark(self, cid) -> None:
        with self._lock:
            self._dirty[cid] = True
        self._wake.set()

    def _loop(self) -> None:
        seen = {}
        while not self._stop:
            self._wake.wait(timeout=0.25)
            self._wake.clear()
            gaussians, version = self.source.get()
            clients = self.server.get_clients()
            with self._lock:
                todo = [cid for cid, dirty in self._dirty.items()
                        if dirty or seen.get(cid) != version]
                for cid in todo:
                    self._dirty[cid] = False
            if gaussians is None:
                continue
            arrays = None
            for cid in todo:
                client = clients.get(cid)
                if client is None:
                    continue
                if arrays is None:
                    arrays = self._arrays(gaussians)
                try:
                    image = self._render(arrays, client.camera)
                    client.scene.set_background_image(image, format="jpeg")
                except Exception as exc:  # a closed socket or a bad camera: skip this frame
                    print(f"arc-warp viewer: frame skipped ({exc})")
                    continue
                seen[cid] = version
                self.frames_sent += 1

    def _arrays(self, g):
        wp = self.wp
        return [wp.array(g["means"], dtype=wp.vec3, device=self.device),
                wp.array(g["quats"], dtype=wp.vec4, device=self.device),
                wp.array(g["scales"], dtype=wp.vec3, device=self.device),
                wp.array(g["opacities"], dtype=wp.float32, device=self.device),
                wp.array(g["sh"], dtype=wp.vec3, device=self.device)]

    def _render(self, arrays, cam_handle) -> np.ndarray:
        from arc_warp import RenderSettings, render_gaussians

        cam = camera_from_viser(cam_handle.wxyz, cam_handle.position, cam_handle.fov,
                                cam_handle.aspect, self.max_size)
        out = render_gaussians(*arrays, cam, RenderSettings(background=self.background))
        return (np.clip(out.color.numpy(), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def torch_gaussians(params: dict, sh_degree: int) -> dict:
    """The trainer's raw parameters (model.py layout) -> activated numpy arrays."""
    import torch

    with torch.no_grad():
        k = (sh_degree + 1) ** 2
        sh = torch.cat([params["sh0"], params["shN"]], dim=1)[:, :k]
        return {"means": params["means"].float().cpu().numpy(),
                "quats": torch.nn.functional.normalize(params["quats"], dim=-1).cpu().numpy(),
                "scales": torch.exp(params["scales"]).cpu().numpy(),
                "opacities": torch.sigmoid(params["opacities"]).cpu().numpy(),
                "sh": sh.cpu().numpy()}


class TrainingView:
    """`arc-warp train --viewer`: a Trainer step hook that publishes the model to a Viewer
    at most every `period_s` seconds, with the step, PSNR and Gaussian count."""

    def __init__(self, viewer: Viewer, period_s: float = 0.5):
        self.viewer, self.period_s, self._last = viewer, period_s, -math.inf

    def __call__(self, trainer, step_result) -> None:
        """``step_result``: what ``Trainer.train_step`` returned; read back (a sync) only
        when the view is refreshed."""
        now = time.monotonic()
        if now - self._last < self.period_s and trainer.step < trainer.cfg.steps:
            return
        self._last = now
        psnr_db = trainer.metrics_of([step_result])[1]
        self.viewer.source.publish(torch_gaussians(trainer.params,
                                                   trainer.sh_degree_at(trainer.step)))
        self.viewer.set_stats(step=f"{trainer.step} / {trainer.cfg.steps}",
                              PSNR=f"{psnr_db:.2f} dB (training view)",
                              Gaussians=int(trainer.params["means"].shape[0]))
        self.viewer.refresh()


def require_viser() -> None:
    try:
        import viser  # noqa: F401
    except ImportError:
        raise ImportError(f"the viewer needs viser, which is not installed: {VIEWER_HINT}") \
            from None


def view_ply(path, port: int = 8080, max_size: int = 256, device=None, up=(0.0, 0.0, 1.0),
             background=(0.0, 0.0, 0.0), host: str = "0.0.0.0") -> Viewer:
    """Serve the 3DGS PLY at `path` (checked as `arc-warp render` checks it); the initial
    camera looks at the scene's median from 25 degrees above, fitting 90 % of it."""
    from arc_warp.cli import _fit, load_gaussians, orbit

    require_viser()
    g = load_gaussians(path)
    center, radius = _fit(g)
    eye = orbit(center, radius, up, 1, 25.0, 50.0, None, 16, 16)[0].center
    return Viewer(GaussianSource(g), port, host, max_size, background, device, up, center, eye)


def cmd_view(args) -> int:
    from arc_warp.cli import quiet_warp, warp_device

    quiet_warp()
    warp_device(args.device)
    viewer = view_ply(args.ply, args.port, args.max_size, args.device, args.up, args.background,
                      args.host)
    print(f"arc-warp view: serving {args.ply} at http://localhost:{viewer.port} (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        viewer.close()
    return 0


def add_view_parser(sub) -> None:
    """Entry point: adds `arc-warp view` to the core's subparsers."""
    from arc_warp.cli import positive_int, unit_rgb, vec3

    p = sub.add_parser("view", help="serve a live, orbitable view of a 3DGS PLY (viser)",
                       description="Serve a 3DGS PLY in the browser: arc_warp renders each "
                       "view on this machine (GPU, or CPU at a small size) and viser shows "
                       f"it. Needs viser ({VIEWER_HINT}).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("ply", help="3DGS PLY file")
    p.add_argument("--port", type=positive_int, default=8080, help="HTTP port")
    p.add_argument("--host", default="0.0.0.0", help="interface to listen on")
    p.add_argument("--max-size", type=positive_int, default=256,
                   help="rendered pixels on the long side")
    p.add_argument("--up", type=vec3, default=(0.0, 0.0, 1.0), help="world up, e.g. 0,-1,0")
    p.add_argument("--background", type=unit_rgb, default=(0.0, 0.0, 0.0),
                   help="RGB, each in [0,1]")
    p.add_argument("--device", default=None, help="warp device (None: warp's default)")
    p.set_defaults(func=cmd_view)
