"""The tb_parity TensorBoard plugin (routes are added by the dashboard work)."""

from __future__ import annotations

from tensorboard.plugins import base_plugin

from tb_parity_plugin import metadata


class ParityPlugin(base_plugin.TBPlugin):
    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._logdir = context.logdir

    def get_plugin_apps(self) -> dict:
        return {}

    def is_active(self) -> bool:
        return False

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js")
