"""Fine-tuning from the notebook: LoRA adapters trained by mlx_lm's tuner in a worker process, kept
on disk as jobs (resumed from their last checkpoint after a crash) and served per request by the
running engines as each checkpoint appears.

`data` (the rows, as mlx_lm reads them), `settings` (what is trained and how), `worker` (one
fine-tune, in its own process), `manager` (the queue, the pauses for chats, serving the results).
"""
