"""A real IPython InteractiveShell with the mlx_nb magics loaded, as the notebook tests drive it."""

import os
from pathlib import Path


def mlx_shell(ipython_dir: Path):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    os.environ.setdefault("IPYTHONDIR", str(ipython_dir))
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=cfg)
    shell.run_line_magic("load_ext", "mlx_nb")
    return shell


def run_cell(ip, source):
    """Run one cell; (its value, what it printed). A cell that raised fails the test."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = ip.run_cell(source, store_history=True)
    assert result.error_in_exec is None and result.error_before_exec is None
    return result.result, cap
