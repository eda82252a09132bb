"""The jupyter-server extension: one shared MLX engine behind `{base_url}mlx/v1/`.

Enabled by `jupyter-config/server-config/mlx_nb.json` (`{"jupyter_ext": true}`), or started alone
with `jupyter mlx`. This package is the extension's module, so it holds the entry point; `mlx_nb`
itself stays free of Jupyter.
"""


def _jupyter_server_extension_points():
    from jupyter_ext.app import MLXExtension

    return [{"module": "jupyter_ext", "app": MLXExtension}]
