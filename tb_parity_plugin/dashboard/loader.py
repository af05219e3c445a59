"""Import-light TensorBoard entry point.

TensorBoard imports every ``tensorboard_plugins`` entry point unguarded at start-up:
if this module failed to import, ``tensorboard`` would exit. So it imports only
TensorBoard's base plugin module and loads the real plugin inside ``load()``.
"""

from __future__ import annotations

from tensorboard.plugins import base_plugin


class ParityLoader(base_plugin.TBLoader):
    """Creates the tb_parity plugin when TensorBoard asks for it."""

    def load(self, context: base_plugin.TBContext) -> base_plugin.TBPlugin:
        from tb_parity_plugin.dashboard.plugin import ParityPlugin

        return ParityPlugin(context)
