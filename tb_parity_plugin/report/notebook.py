"""Show only the tb_parity view inline in Colab / Jupyter, or print its URL in a terminal.

The server is started or reused through TensorBoard's own ``tensorboard.manager`` with
the same arguments ``%tensorboard --logdir LOGDIR`` would use, so both share one
process (and ``%tensorboard`` keeps showing the full app with our tab). Instead of the
whole app we frame ``data/plugin_entry.html?name=tb_parity``, the page TensorBoard
itself frames for a plugin, with the pair in the URL hash (``#baseline=..&candidate=..``,
read by the dashboard's frontend).
"""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import os
import shlex
import shutil
import sys
import uuid
from typing import Any, Iterator, Optional
from urllib.parse import quote, urlencode

from tensorboard import manager
from tensorboard import notebook as tb_notebook

from tb_parity_plugin.records import metadata

__all__ = ["show", "start_server", "entry_path", "load_ipython_extension"]


def entry_path(baseline: Optional[str] = None, candidate: Optional[str] = None, path_prefix: str = "") -> str:
    """Server-absolute path of our view alone, the pair preselected through the hash."""
    path = f"{path_prefix.rstrip('/')}/data/plugin_entry.html?name={metadata.PLUGIN_NAME}"
    pair = [(k, v) for k, v in (("baseline", baseline), ("candidate", candidate)) if v]
    # quote, not quote_plus: URLSearchParams would read a literal "+" in a run name as a space.
    return path + ("#" + urlencode(pair, quote_via=quote, safe="/") if pair else "")


@contextlib.contextmanager
def _tensorboard_binary() -> Iterator[None]:
    """Lets ``manager.start`` find the ``tensorboard`` of this interpreter.

    ``manager.start`` runs ``tensorboard`` from PATH; a kernel started from a venv that
    was never activated has the venv's ``bin/`` missing from PATH.
    """
    own = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    if "TENSORBOARD_BINARY" in os.environ or shutil.which("tensorboard") or not os.path.exists(own):
        yield
        return
    os.environ["TENSORBOARD_BINARY"] = own
    try:
        yield
    finally:
        os.environ.pop("TENSORBOARD_BINARY", None)


def _forget_if_dead(info: manager.TensorBoardInfo) -> bool:
    """Drops the manager's record of a server that died without removing it (e.g. killed
    with its kernel), which ``manager.start`` would otherwise keep "reusing"; True if dropped."""
    try:
        os.kill(info.pid, 0)
        return False
    except ProcessLookupError:
        pass
    except PermissionError:  # alive, another user's
        return False
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(manager._get_info_dir(), f"pid-{info.pid}.info"))
    return True


def start_server(logdir: str, port: Optional[int] = None) -> manager.TensorBoardInfo:
    """Starts TensorBoard on ``logdir`` or reuses the one started with the same arguments.

    Raises:
      RuntimeError: TensorBoard could not be started (its stderr is in the message).
    """
    args = ["--logdir", str(logdir)] + (["--port", str(port)] if port is not None else [])
    with _tensorboard_binary():
        result = manager.start(args)
        if isinstance(result, manager.StartReused) and _forget_if_dead(result.info):
            result = manager.start(args)
    if isinstance(result, (manager.StartLaunched, manager.StartReused)):
        return result.info
    if isinstance(result, manager.StartFailed):
        detail = (result.stderr or result.stdout or "").strip()
        raise RuntimeError(f"TensorBoard exited with {result.exit_code}: {detail}")
    if isinstance(result, manager.StartExecFailed):
        raise RuntimeError(f"could not run tensorboard: {result.os_error}")
    raise RuntimeError(f"TensorBoard did not come up (pid {getattr(result, 'pid', '?')}); try again")


def _js(value: str) -> str:
    """A JS string literal that cannot close the surrounding ``<script>``."""
    return json.dumps(value).replace("<", "\\u003c")


def _iframe_html(src: str, height: int, page_port: Optional[int] = None, path: str = "") -> str:
    """An iframe on ``src``. With ``page_port``, a script retargets it to ``path`` on the
    notebook page's own host at that port, as ``%tensorboard`` does for a remote Jupyter;
    ``src`` stays the fallback where scripts do not run."""
    frame_id = f"tb-parity-{uuid.uuid4().hex[:12]}"
    tag = (
        f'<iframe id="{frame_id}" class="tb-parity-view" src="{html.escape(src, quote=True)}" '
        f'width="100%" height="{int(height)}" frameborder="0"></iframe>'
    )
    if page_port is None:
        return tag
    # %-format: the script's own braces would all need doubling in an f-string.
    script = (
        "<script>(function(){const f=document.getElementById(%s);"  # noqa: UP031
        "if(!/^https?:$/.test(window.location.protocol))return;"
        "const u=new URL(%s,window.location);u.port=%d;f.src=u;})();</script>" % (_js(frame_id), _js(path), page_port)
    )
    return tag + script


def _display_jupyter(port: int, path: str, height: int) -> None:
    """Jupyter: ``TENSORBOARD_PROXY_URL`` (``%PORT%`` substituted) when set, else the port."""
    import IPython.display

    proxy = os.environ.get("TENSORBOARD_PROXY_URL")
    if proxy is not None:
        base = proxy.replace("%PORT%", str(port))
        src = base.rstrip("/") + "/" + path.lstrip("/")
        markup = _iframe_html(src, height)
    else:
        markup = _iframe_html(f"http://localhost:{port}{path}", height, page_port=port, path=path)
    IPython.display.display(IPython.display.HTML(markup))


def _display_colab(port: int, path: str, height: int) -> None:
    """Colab: the VM is reached only through the kernel port proxy."""
    from google.colab import output

    output.serve_kernel_port_as_iframe(port, path=path, height=str(int(height)))


def show(
    logdir: str,
    baseline: Optional[str] = None,
    candidate: Optional[str] = None,
    *,
    port: Optional[int] = None,
    height: int = 800,
) -> str:
    """Shows the parity view for ``logdir`` with the pair preselected.

    Args:
      logdir: the logdir, as you would pass it to ``tensorboard --logdir``.
      baseline, candidate: run names; ``None`` leaves the dashboard's suggested pair.
      port: the server's port; ``None`` lets TensorBoard choose (or reuse a server).
      height: the frame's height in pixels.

    Returns:
      The view's direct URL (``http://localhost:PORT/...``).
    """
    info = start_server(logdir, port)
    path = entry_path(baseline, candidate, info.path_prefix)
    url = f"http://localhost:{info.port}{path}"
    context = tb_notebook._get_context()  # the same Colab / Jupyter / terminal test as %tensorboard
    if context == tb_notebook._CONTEXT_COLAB:
        _display_colab(info.port, path, height)
    elif context == tb_notebook._CONTEXT_IPYTHON:
        _display_jupyter(info.port, path, height)
    else:
        print(f"tb-parity view: {url}")
    return url


def _magic_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%tb_parity", description="Show the tb_parity view inline.")
    parser.add_argument("logdir")
    parser.add_argument("--baseline")
    parser.add_argument("--candidate")
    parser.add_argument("--port", type=int)
    parser.add_argument("--height", type=int, default=800)
    return parser


def _tb_parity_magic(line: str) -> None:
    """``%tb_parity LOGDIR [--baseline R] [--candidate R] [--port P] [--height H]``."""
    try:
        args = _magic_parser().parse_args(shlex.split(line, posix=True))
    except SystemExit:  # argparse already printed the usage; a magic must not kill the kernel
        return
    show(args.logdir, args.baseline, args.candidate, port=args.port, height=args.height)


def load_ipython_extension(ipython: Any) -> None:
    """Registers ``%tb_parity`` (``%load_ext tb_parity_plugin``); leaves ``%tensorboard`` alone."""
    ipython.register_magic_function(_tb_parity_magic, magic_kind="line", magic_name="tb_parity")
