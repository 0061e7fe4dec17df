"""A load request's callback that waits for its grant: what benches and tests use when
they need a listener to prepare under and nothing else of the request's story."""

from __future__ import annotations

import threading
from typing import Any

from npumanager import LoadStatus, ModelLoadRequestCallback


class Granted(ModelLoadRequestCallback):
    """Sets ``event`` and keeps ``listener`` when npud answers CAN_LOAD_NOW."""

    def __init__(self) -> None:
        self.listener: Any = None
        self.event = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.event.set()
