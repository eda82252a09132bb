"""The engine thread: its loop, the batch runner, and who runs when — interactive requests, the
background lane of dataset jobs, prefill pacing, the sequential and vision lanes — with the
memory it may hold and the latencies it keeps."""
