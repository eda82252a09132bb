"""The Lab extension's own unit tests (labextension/tests, jest in a jsdom DOM), run by the suite:
what the browser tests do not reach (every engine state the status bar names, the SVG cleaning
against hostile pictures, the chat box stopping its stream when disposed, the settings schema's
defaults against the code's). `make test` installed the toolchain (`npm ci` in labextension/).
And the settings schema as JupyterLab reads it: where package.json says, named for the plugin."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from jsonschema import Draft7Validator

HERE = Path(__file__).resolve().parents[1] / "labextension"


def test_jest_unit_tests_pass():
    if shutil.which("npm") is None:
        pytest.skip("NOT RUN: npm is not installed (node 18+ builds and tests the Lab extension)")
    assert (HERE / "node_modules" / ".bin" / "jest").exists(), "run make test: it installs the extension's toolchain"
    done = subprocess.run(["npm", "test", "--silent"], cwd=HERE, capture_output=True, text=True, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    assert "Tests:" in report and "failed" not in report.split("Tests:")[1].splitlines()[0], report[-2000:]


def test_settings_schema_is_where_jupyterlab_looks_and_valid():
    """JupyterLab's builder ships `jupyterlab.schemaDir` and the settings registry finds a plugin's
    schema by its id (`package:plugin` -> `<schemaDir>/plugin.json`); the server validates saved
    settings against it as JSON Schema (draft 7), so its own defaults must pass it."""
    package = json.loads((HERE / "package.json").read_text())
    assert package["jupyterlab"]["schemaDir"] == "schema"
    plugin_id = re.search(r"PLUGIN_ID = '([^']+)'", (HERE / "src" / "settings.ts").read_text()).group(1)
    name, _, plugin = plugin_id.partition(":")
    assert name == package["name"], plugin_id
    schema = json.loads((HERE / package["jupyterlab"]["schemaDir"] / f"{plugin}.json").read_text())
    Draft7Validator.check_schema(schema)
    validator = Draft7Validator(schema)
    defaults = {key: prop["default"] for key, prop in schema["properties"].items()}
    validator.validate(defaults)
    # the constants the settings replace are their defaults (jest checks the code uses the same)
    assert defaults["pollInterval"] == 1000 and defaults["timelineLanes"] == 12, defaults
    assert not validator.is_valid({"pollInterval": 10}), "a poll that hammers the server is refused"
    assert not validator.is_valid({"timelineLanes": 0}) and not validator.is_valid({"lanes": 3})
