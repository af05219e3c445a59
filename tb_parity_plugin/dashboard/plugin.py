"""The tb_parity TensorBoard plugin: JSON routes over the comparison engine, and the tab.

Routes (under ``data/plugin/tb_parity/``; see docs/dashboard.md for the payloads):
``/index.js`` (the bundled frontend), ``/runs``, ``/summary``, ``/matrix``,
``/tensor``, ``/scalars``. Handlers only parse the request (``routes_params``) and
call an ``*_impl`` method. Data comes from the plugin's own incremental reader on a
background thread, never from TensorBoard's sampled data provider. Nothing here
imports TensorFlow.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Optional, TypeVar

from tensorboard import errors
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_parity_plugin import api
from tb_parity_plugin.dashboard import params, views
from tb_parity_plugin.engine.comparison_cache import ComparisonCache, Entry
from tb_parity_plugin.logdir import run_pairs
from tb_parity_plugin.logdir.background_reader import BackgroundReader
from tb_parity_plugin.logdir.rundata import RunData
from tb_parity_plugin.records import metadata

logger = logging.getLogger(__name__)

STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "static")
#: Static files the plugin serves, and their content types. A fixed table: the
#: request path never reaches the filesystem.
STATIC_FILES = {"/index.js": ("index.js", "text/javascript")}
DEFAULT_RELOAD_INTERVAL = 5.0

Handler = Callable[[wrappers.Request], wrappers.Response]
T = TypeVar("T")


def _respond(request: wrappers.Request, content: Any, content_type: str, code: int = 200) -> wrappers.Response:
    """``http_util.Respond``, which TensorBoard leaves unannotated."""
    response: wrappers.Response = http_util.Respond(request, content, content_type, code=code)
    return response


def _json_route(route: str) -> Callable[[Callable[..., Any]], Handler]:
    """Wrap a handler: check parameter names, answer JSON, and errors as JSON 400/404."""

    def decorate(fn: Callable[..., Any]) -> Handler:
        @functools.wraps(fn)
        @wrappers.Request.application  # type: ignore[arg-type]  # werkzeug's stub omits the method form it supports
        def handler(self: ParityPlugin, request: wrappers.Request) -> wrappers.Response:
            try:
                args = params.Args(request.args)
                params.check_known(route, args)
                body = fn(self, args)
            except errors.PublicError as exc:
                return _respond(request, {"error": str(exc)}, "application/json", code=exc.http_code)
            return _respond(request, body, "application/json")

        return handler  # type: ignore[return-value]  # a WSGI app per werkzeug's stub; a method in fact

    return decorate


class ParityPlugin(base_plugin.TBPlugin):
    """Serves the tb_parity tab."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext, reload_interval: Optional[float] = None) -> None:
        self._logdir = context.logdir or ""
        if reload_interval is None:
            flag = getattr(context.flags, "reload_interval", None) if context.flags is not None else None
            reload_interval = float(flag) if flag and flag > 0 else DEFAULT_RELOAD_INTERVAL
        self._reader = BackgroundReader(self._logdir, reload_interval)
        self._cache = ComparisonCache()

    # -- TensorBoard hooks ---------------------------------------------------------
    def get_plugin_apps(self) -> dict[str, Callable[..., Any]]:
        apps: dict[str, Callable[..., Any]] = {path: self._serve_static for path in STATIC_FILES}
        apps.update(
            {
                "/runs": self._serve_runs,
                "/summary": self._serve_summary,
                "/matrix": self._serve_matrix,
                "/tensor": self._serve_tensor,
                "/scalars": self._serve_scalars,
            }
        )
        return apps

    def is_active(self) -> bool:
        """Cheap: starts the reader thread and answers from what it has read so far."""
        if not self._logdir:
            return False
        self._reader.start()
        return bool(self._reader.run_names())

    def data_plugin_names(self) -> tuple[str, ...]:
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="TB Parity")

    # -- static files --------------------------------------------------------------
    @wrappers.Request.application  # type: ignore[arg-type]  # werkzeug's stub omits the method form it supports
    def _serve_static(self, request: wrappers.Request) -> wrappers.Response:
        name, content_type = STATIC_FILES[request.path[request.path.rindex("/") :]]
        try:
            with open(os.path.join(STATIC_DIR, name), "rb") as f:
                content = f.read()
        except OSError:
            return _respond(request, {"error": f"{name} is not built (make frontend)"}, "application/json", code=404)
        return _respond(request, content, content_type)

    # -- JSON routes: parse, then call the impl --------------------------------------
    @_json_route("runs")
    def _serve_runs(self, args: params.Args) -> dict[str, Any]:
        return self.runs_impl()

    @_json_route("summary")
    def _serve_summary(self, args: params.Args) -> dict[str, Any]:
        return self.summary_impl(params.parse_pair(args))

    @_json_route("matrix")
    def _serve_matrix(self, args: params.Args) -> dict[str, Any]:
        return self.matrix_impl(params.parse_pair(args), params.parse_width(args))

    @_json_route("tensor")
    def _serve_tensor(self, args: params.Args) -> dict[str, Any]:
        tag, values_at, replica = params.parse_tensor(args)
        return self.tensor_impl(params.parse_pair(args), tag, values_at, replica)

    @_json_route("scalars")
    def _serve_scalars(self, args: params.Args) -> dict[str, Any]:
        return self.scalars_impl(params.parse_pair(args))

    # -- implementations -----------------------------------------------------------
    def runs_impl(self) -> dict[str, Any]:
        """Runs with parity data, and a suggested baseline/candidate pair per folder."""
        self._reader.wait_first_load()
        runs = []
        for name in self._reader.run_names():
            try:
                run = self._reader.run(name)
            except KeyError:
                continue
            if run.tensors or run.info:
                runs.append(views.run_entry(run))
        pairs = run_pairs.suggest_pairs({r["name"]: r["side"] for r in runs})
        return {
            "runs": runs,
            "pairs": pairs,
            "suggested": pairs[0] if pairs else None,
            "loaded": self._reader.loaded,
            "error": self._reader.error,
        }

    def _use(self, query: params.PairQuery, fn: Callable[[Entry, RunData, RunData], T]) -> T:
        """Run ``fn(entry, base, cand)`` on the pair's up-to-date cached comparison."""
        self._reader.wait_first_load()
        sides = {}
        for name in self._reader.run_names():
            try:
                sides[name] = str(self._reader.run(name).info.get("side", ""))
            except KeyError:  # vanished since listed
                continue
        try:
            run_pairs.choose_pair(sides, query.baseline, query.candidate, where="this logdir")
            base, cand = self._reader.run(query.baseline), self._reader.run(query.candidate)
        except run_pairs.RunPairError as exc:
            error = errors.NotFoundError if exc.missing is not None else errors.InvalidArgumentError
            raise error(str(exc)) from None
        except KeyError as exc:
            raise errors.NotFoundError(f"no run {exc.args[0]!r} in this logdir") from None
        for run in (base, cand):
            # as the CLI refuses it: a port whose event files hold nothing of ours was a structure
            # DIVERGE here, every baseline tensor "recorded by one run only" (h102); a run whose steps
            # were lost to read problems keeps its verdict, the problems beside it
            error = None if run.problems else api.no_records_error(run, "this logdir")
            if error is not None:
                raise errors.NotFoundError(error)
        return self._cache.use(
            query.cache_key, base, cand, query.policy, query.mapping, lambda entry: fn(entry, base, cand)
        )

    def summary_impl(self, query: params.PairQuery) -> dict[str, Any]:
        return self._use(query, lambda e, b, c: views.summary_payload(e.report, e.generations))

    def matrix_impl(self, query: params.PairQuery, width: Optional[int]) -> dict[str, Any]:
        def build(entry: Entry, base: RunData, cand: RunData) -> dict[str, Any]:
            return entry.memo(
                ("matrix", width),
                lambda: views.matrix_payload(entry.comparison.matrix(width), entry.report),
            )

        return self._use(query, build)

    def tensor_impl(
        self, query: params.PairQuery, tag: str, values_at: Optional[int], replica: Optional[int] = None
    ) -> dict[str, Any]:
        def build(entry: Entry, base: RunData, cand: RunData) -> dict[str, Any]:
            kind, _, name = tag.partition("/")
            if (kind, name) not in base.tensors:
                raise errors.NotFoundError(f"no tensor {tag!r} in baseline run {base.name!r}")
            try:
                detail = entry.comparison.detail(tag, values_at, replica)
            except KeyError as exc:
                raise errors.NotFoundError(str(exc.args[0]) if exc.args else str(exc)) from None
            return views.tensor_payload(detail, base, cand, values_at)

        return self._use(query, build)

    def scalars_impl(self, query: params.PairQuery) -> dict[str, Any]:
        return self._use(
            query,
            lambda e, b, c: e.memo(("scalars",), lambda: views.scalars_payload(b, c, e.report, query.policy)),
        )
