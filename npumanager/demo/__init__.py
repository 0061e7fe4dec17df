"""`npu demo`: npumanager's main job shown end to end, for real (see ``scenario``).

Modules: ``models`` (the apps' ONNX models), ``apps`` (what each app does in
its process), ``process`` (fork + setuid + event pipes), ``observe`` (app
events, HAL work events), ``render`` (terminal/CI output), ``summary`` (the
closing tables), ``cast`` (the options, the apps and their pace, the record),
``scenario`` (the story).
"""

from npumanager.demo.cast import DemoOptions
from npumanager.demo.scenario import run_demo

__all__ = ["DemoOptions", "run_demo"]
