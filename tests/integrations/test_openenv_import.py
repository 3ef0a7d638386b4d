"""Importing the OpenEnv client does not import gradio (OpenEnv's web UI, most of the import
time), and OpenEnv's web-UI names still resolve when something asks for them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="needs the openenv extra")

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
import agentgym.integrations.openenv
print("GRADIO", "gradio" in sys.modules)
from openenv.core.env_server import WebInterfaceManager
import openenv.core
print("UI", WebInterfaceManager.__name__, openenv.core.create_web_interface_app.__name__)
print("GRADIO", "gradio" in sys.modules)
"""


def test_the_client_module_does_not_import_gradio():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "GRADIO False"
    assert lines[1] == "UI WebInterfaceManager create_web_interface_app"  # imported on demand
    assert lines[2] == "GRADIO True"
