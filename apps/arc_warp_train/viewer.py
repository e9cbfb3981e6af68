"""Live web viewer on viser: arc_warp renders on the server, the browser orbits.

Each connected browser gets its own camera; whenever it moves (or the scene changes) a
render thread draws the view with `arc_warp.render_gaussians` at most `max_size` pixels
on its long side and sends it as the browser's background image. Used by
`arc-warp view scene.ply` and `arc-warp train --viewer` (which publishes snapshots of
the model with the step, PSNR and Gaussian count).

Camera convention: viser's camera pose (wxyz, position) is camera-to-world with OpenCV
axes (+x right, +y down, +z forward), as arc_warp's; fov is vertical, in radians. The
browser's camera is a pinhole; a `Lens` renders the same pose through another camera
model instead (a fisheye, or a training capture's own lens), picked in the side panel's
"camera" menu (`arc-warp view --camera-model fisheye`; `arc-warp train --viewer` offers
the capture's lens when it is not a plain pinhole).

Network: the server listens on 127.0.0.1 (this machine only) unless a host is given, and
has no authentication, so another host exposes the scene to whoever can reach it (the
commands print a warning). The address is checked before the server starts
(`check_listen_address`): a name that does not resolve, an address not of this machine,
a port outside 0..65535 or already in use is a ValueError, where viser would hang or
silently move to the next port; port 0 takes a free port.

Cross-origin websockets: browsers send an Origin header with every websocket upgrade,
and a page of any site may open a websocket to localhost. viser 1.1.1 passes no
`origins` to websockets' `serve` and has no hook for its handshake, so
`_install_origin_check` replaces the `websockets` name inside viser's infra module only
(nowhere else) by a view whose `asyncio.server.serve` adds a `process_request` check in
front of viser's own: an upgrade is refused (HTTP 403) when its Origin is not the page's
own (scheme http(s) and host:port equal to the Host header) and, for a loopback server,
when its Host is not a loopback name (DNS rebinding). Upgrades without an Origin (not a
browser) pass. This relies on viser 1.1.1's internals (pinned in pyproject.toml's
`viewer` extra); tests/test_viewer.py fails if the check stops taking effect.
Handshake failures of clients (a socket closed before its request, a malformed request)
are not logged; other websockets errors are logged as one line, without a traceback.
"""

import argparse
import errno
import http
import ipaddress
import logging
import math
import socket
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

VIEWER_HINT = "pip install -e '.[viewer]' (from the arc_warp checkout)"
LOOPBACK = "127.0.0.1"
"""The default host: reachable from this machine only."""


def port_number(text) -> int:
    """argparse type of a TCP port: an int in 0..65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in 0..65535 (0: any free "
                                         f"port), got {text!r}")
    return value


def _loopback_name(name) -> bool:
    if not name:
        return False
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """True when every address `host` resolves to is a loopback one (this machine only)."""
    if _loopback_name(host):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback
                               for info in infos)


def check_listen_address(host: str, port: int, host_option: str = "host",
                         port_option: str = "port") -> None:
    """ValueError (one line naming the options and what to do) unless a server can listen
    on `host`:`port` now: the host resolves to addresses of this machine and the port
    (0..65535; 0 is any free port) is free on each of them. Binds and releases the
    sockets as the server will (SO_REUSEADDR, IPv6 sockets IPv6-only)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{port_option} {port!r}: expected a port number in 0..65535 (0: any "
                         "free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ValueError(f"{host_option} {host}: not a host name or address this machine can "
                         f"listen on ({reason}); use {LOOPBACK} (the default) or one of this "
                         "machine's addresses") from None
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ValueError(f"{port_option} {port}: the port is in use on {host}; pick "
                                     f"another {port_option}, or {port_option} 0 for a free "
                                     "one") from None
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise ValueError(f"{host_option} {host}: not an address of this machine; "
                                     f"use {LOOPBACK} (the default) or one of this machine's "
                                     "addresses") from None
                raise ValueError(f"{host_option} {host} {port_option} {port}: cannot listen "
                                 f"there ({exc.strerror or exc})") from None


def serving_notice(host: str, port: int, host_option: str = "--host") -> list:
    """Lines to print when a viewer starts: its URL, and a warning when it is reachable from
    other machines."""
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    url = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"
    if is_loopback_host(host):
        return [url]
    return [url, f"warning: {host_option} {host}: the viewer is reachable from other machines "
                 "on that network, with no authentication; anyone who reaches it sees the "
                 f"scene. Leave out {host_option} to serve on this machine only."]


def _origin_allowed(headers, loopback: bool) -> bool:
    """May a websocket upgrade with these request headers proceed (see the module
    docstring)?"""
    host = headers.get("Host", "")
    if loopback and not _loopback_name(urlsplit("//" + host).hostname):
        return False
    origin = headers.get("Origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


class _Override:
    """Attribute access to `target`, with the attributes in `replaced` taking precedence."""

    def __init__(self, target, **replaced):
        self._target, self._replaced = target, replaced

    def __getattr__(self, name):
        return self._replaced[name] if name in self._replaced else getattr(self._target, name)


def _serve_with_origin_check(serve):
    """websockets' `serve`, with the Origin and Host check in front of `process_request`."""
    def checked_serve(handler, host=None, port=None, *, process_request=None, **kwargs):
        loopback = host is not None and is_loopback_host(host)

        def check(connection, request):
            if request.headers.get("Upgrade", "").lower() == "websocket" \
                    and not _origin_allowed(request.headers, loopback):
                return connection.respond(http.HTTPStatus.FORBIDDEN,
                                          "arc-warp viewer: cross-origin websocket refused\n")
            return None if process_request is None else process_request(connection, request)

        return serve(handler, host, port, process_request=check, **kwargs)

    return checked_serve


class _QuietHandshakes(logging.Filter):
    """On websockets' server logger: drops handshakes that failed through the client (a
    malformed request, a socket closed or silent before its request) and writes any other
    error as one line, without its traceback."""

    def filter(self, record) -> bool:
        from websockets.exceptions import InvalidHandshake

        exc = record.exc_info[1] if record.exc_info else None
        if record.getMessage() == "opening handshake failed" and isinstance(
                exc, (InvalidHandshake, EOFError, ConnectionError, TimeoutError)):
            return False
        if exc is not None:
            record.msg, record.args = f"{record.getMessage()}: {exc!r}", ()
            record.exc_info = record.exc_text = None
        return True


def _install_origin_check() -> None:
    """Make viser's server check Origin and Host and log quietly (see module docstring)."""
    from viser.infra import _infra

    logger = logging.getLogger("websockets.server")
    if not any(isinstance(f, _QuietHandshakes) for f in logger.filters):
        logger.addFilter(_QuietHandshakes())
    real = _infra.websockets
    if isinstance(real, _Override):
        return
    import websockets.asyncio.server as server_module

    _infra.websockets = _Override(real, asyncio=_Override(real.asyncio, server=_Override(
        server_module, serve=_serve_with_origin_check(server_module.serve))))


def _quat_wxyz_to_rotmat(q) -> np.ndarray:
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


@dataclass(frozen=True)
class Lens:
    """A camera model for the viewer's pose in place of the browser's pinhole: arc_warp's
    `model` ("pinhole" or "fisheye") with its `distortion` (`arc_warp.Distortion` or None)
    and focal length `focal` in units of the image's long side (square pixels, principal
    point at the centre)."""

    model: str
    distortion: object = None
    focal: float = 1.0

    @classmethod
    def fisheye(cls, fov_deg: float = 180.0) -> "Lens":
        """An equidistant fisheye seeing `fov_deg` degrees (in (0, 360)) across the image's
        long side."""
        if not 0.0 < fov_deg < 360.0:
            raise ValueError(f"fisheye field of view must be in (0, 360) degrees, got {fov_deg!r}")
        return cls("fisheye", None, 1.0 / math.radians(fov_deg))

    @classmethod
    def of_view(cls, view) -> "Lens":
        """A capture's lens: a `datasets.View`'s model, distortion and horizontal focal
        length relative to its long side."""
        return cls(view.model, view.distortion, float(view.K[0, 0]) / max(view.width, view.height))

    @property
    def label(self) -> str:
        return self.model + (" + distortion" if self.distortion is not None else "")


def camera_from_viser(wxyz, position, fov_y: float, aspect: float, max_size: int, lens: Lens = None):
    """An arc_warp Camera for a viser camera state, max_size pixels on its long side: the
    browser's pinhole (vertical field of view `fov_y`), or `lens` at the same pose.
    ValueError (from `arc_warp.Camera`) when the lens cannot draw this image's corners."""
    from arc_warp import Camera

    width, height = (max_size, max(1, round(max_size / aspect))) if aspect >= 1.0 else \
        (max(1, round(max_size * aspect)), max_size)
    c2w = np.eye(4)
    c2w[:3, :3] = _quat_wxyz_to_rotmat(wxyz)
    c2w[:3, 3] = position
    if lens is None:
        focal, model, distortion = 0.5 * height / math.tan(0.5 * fov_y), "pinhole", None
    else:
        focal, model, distortion = lens.focal * max(width, height), lens.model, lens.distortion
    return Camera(focal, focal, 0.5 * width, 0.5 * height, width, height,
                  world_to_camera=np.linalg.inv(c2w), model=model, distortion=distortion)


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

    Listens on `host`:`port` (see the module docstring; port 0 takes a free one, read it
    from `port`); ValueError before anything starts when it cannot. stats: text shown in
    the side panel, updated with `set_stats(name=value, ...)`. lenses: {name: `Lens` or
    None (the browser's pinhole)}, offered in the side panel's "camera" menu when there
    are several, `camera` (a name) chosen first; a lens that cannot draw the window's
    corners shows the pinhole instead, with a note. frames_sent counts background images
    sent (all clients). `close()` stops it."""

    def __init__(self, source: GaussianSource, port: int = 8080, host: str = LOOPBACK,
                 max_size: int = 256, background=(0.0, 0.0, 0.0), device=None,
                 up=(0.0, 0.0, 1.0), look_at=(0.0, 0.0, 0.0), eye=None, stats=(),
                 lenses=None, camera: str = None):
        import viser
        import warp as wp

        check_listen_address(host, port)
        self.wp, self.source, self.max_size = wp, source, int(max_size)
        self.device = wp.get_device(device)
        self.background = tuple(float(b) for b in background)
        _install_origin_check()
        self.server = viser.ViserServer(host=host, port=port, verbose=False)
        if port and self.server.get_port() != port:  # taken since the check: viser moved on
            self.server.stop()
            raise ValueError(f"port {port}: the port is in use on {host}; pick another port, "
                             "or port 0 for a free one")
        self.server.scene.set_up_direction(tuple(float(u) for u in up))
        self._eye, self._target, self._up = eye, look_at, up
        self._stats = {name: self.server.gui.add_text(name, initial_value="-", disabled=True)
                       for name in stats}
        self.lenses = dict(lenses or {"pinhole": None})
        if camera is not None and camera not in self.lenses:
            raise ValueError(f"camera {camera!r}: not one of the viewer's lenses {tuple(self.lenses)}")
        self.camera = self.server.gui.add_dropdown(
            "camera", tuple(self.lenses), initial_value=camera or next(iter(self.lenses)),
            visible=len(self.lenses) > 1)
        self.camera.on_update(lambda _event: self.refresh())
        self._refused = set()  # lenses noted as unable to draw a window
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

        name = self.camera.value
        pose = (cam_handle.wxyz, cam_handle.position, cam_handle.fov, cam_handle.aspect, self.max_size)
        try:
            cam = camera_from_viser(*pose, self.lenses[name])
        except ValueError as exc:  # the lens folds inside this window's corners
            if name not in self._refused:
                self._refused.add(name)
                print(f"arc-warp viewer: camera {name!r} cannot draw this window ({exc}); showing the pinhole")
            cam = camera_from_viser(*pose)
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
             background=(0.0, 0.0, 0.0), host: str = LOOPBACK, camera_model: str = "pinhole",
             fisheye_fov: float = 180.0) -> Viewer:
    """Serve the 3DGS PLY at `path` (checked as `arc-warp render` checks it); the initial
    camera looks at the scene's median from 25 degrees above, fitting 90 % of it. The
    "camera" menu offers the browser's pinhole and an equidistant fisheye of `fisheye_fov`
    degrees across the long side; `camera_model` ("pinhole" or "fisheye") is shown first."""
    from arc_warp.cli import _fit, load_gaussians, orbit

    require_viser()
    g = load_gaussians(path)
    center, radius = _fit(g)
    eye = orbit(center, radius, up, 1, 25.0, 50.0, None, 16, 16)[0].center
    lenses = {"pinhole": None, "fisheye": Lens.fisheye(fisheye_fov)}
    return Viewer(GaussianSource(g), port, host, max_size, background, device, up, center, eye,
                  lenses=lenses, camera=camera_model)


def cmd_view(args) -> int:
    from arc_warp.cli import quiet_warp, warp_device

    try:
        require_viser()
        check_listen_address(args.host, args.port, "--host", "--port")
        quiet_warp()
        warp_device(args.device)
        viewer = view_ply(args.ply, args.port, args.max_size, args.device, args.up,
                          args.background, args.host, args.camera_model, args.fisheye_fov)
    except KeyboardInterrupt:
        print("arc-warp view: interrupted while starting", file=sys.stderr)
        return 130
    url, *warning = serving_notice(args.host, viewer.port)
    print(f"arc-warp view: serving {args.ply} at {url} (Ctrl-C stops)", flush=True)
    for line in warning:
        print(line, file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        viewer.close()
    return 0


def _degrees(text) -> float:
    """argparse type of a field of view: degrees in (0, 360)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < 360.0:
        raise argparse.ArgumentTypeError(f"expected degrees in (0, 360), got {text!r}")
    return value


def add_view_parser(sub) -> None:
    """Entry point: adds `arc-warp view` to the core's subparsers."""
    from arc_warp.cli import positive_int, unit_rgb, vec3

    p = sub.add_parser("view", help="serve a live, orbitable view of a 3DGS PLY (viser)",
                       description="Serve a 3DGS PLY in the browser: arc_warp renders each "
                       "view on this machine (GPU, or CPU at a small size) and viser shows "
                       f"it. Needs viser ({VIEWER_HINT}).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("ply", help="3DGS PLY file")
    p.add_argument("--port", type=port_number, default=8080,
                   help="HTTP port (0: any free port, printed)")
    p.add_argument("--host", default=LOOPBACK,
                   help="address to listen on; the default serves this machine only, another "
                   "(e.g. 0.0.0.0) exposes the unauthenticated viewer to the network")
    p.add_argument("--max-size", type=positive_int, default=256,
                   help="rendered pixels on the long side")
    p.add_argument("--up", type=vec3, default=(0.0, 0.0, 1.0), help="world up, e.g. 0,-1,0")
    p.add_argument("--background", type=unit_rgb, default=(0.0, 0.0, 0.0),
                   help="RGB, each in [0,1]")
    p.add_argument("--camera-model", choices=("pinhole", "fisheye"), default="pinhole",
                   help="camera shown first (the side panel switches): the browser's pinhole, or "
                   "an equidistant fisheye at the same pose")
    p.add_argument("--fisheye-fov", type=_degrees, default=180.0,
                   help="the fisheye's field of view across the image's long side, degrees")
    p.add_argument("--device", default=None, help="warp device (None: warp's default)")
    p.set_defaults(func=cmd_view)
