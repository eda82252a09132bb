"""Dataset jobs: a model over many rows, in the background lane of the shared batch, kept on disk.

`store` (jobs and files on disk, within a budget), `lines` (the Batch API's input and output
lines), `rows` (one row through its route), `runner` (one job's rows, each result durable as it
ends), `manager` (the jobs of a process), `tables` (a map over a table: rows in, columns out).
Nothing here imports MLX: the rows reach the engines through their thread-safe faces.
"""
