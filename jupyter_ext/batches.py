"""OpenAI's Files and Batches routes: thin adapters over mlx_nb.api.batches (the job machinery is
mlx_nb/jobs; the extension owns one JobManager, `ext.jobs`). File uploads have their own size
limit (`max_file_bytes`), checked from Content-Length before the body is read into a file."""

from __future__ import annotations

import asyncio

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_ext.base import MLXHandler
from mlx_nb.api import batches


class FilesHandler(MLXHandler):
    def _check_body_size(self) -> None:
        limit = self.ext.max_file_bytes
        declared = self.request.headers.get("Content-Length", "")
        size = max(len(self.request.body), int(declared) if declared.isdigit() else 0)
        if size > limit:
            raise batches.file_too_large(size, limit)

    @web.authenticated
    @authorized
    async def get(self):
        self.write_json(batches.list_files(self.ext.jobs.store, self.get_query_argument("purpose", None)))

    @web.authenticated
    @authorized
    async def post(self):
        upload = (self.request.files.get("file") or [None])[0]
        purpose = self.get_body_argument("purpose", None)
        data = upload["body"] if upload is not None else None
        name = upload.get("filename", "") if upload is not None else ""
        meta = await asyncio.to_thread(batches.upload_file, self.ext.jobs.store, data, name, purpose,
                                       self.ext.max_file_bytes)
        self.write_json(meta)


class FileHandler(MLXHandler):
    @web.authenticated
    @authorized
    async def get(self, file_id: str, content: str = None):
        store = self.ext.jobs.store
        if content:
            data = await asyncio.to_thread(batches.file_content, store, file_id)
            self.set_header("Content-Type", "application/jsonl")
            return self.finish(data)
        self.write_json(batches.file_object(store, file_id))

    @web.authenticated
    @authorized
    async def delete(self, file_id: str, content: str = None):
        if content:
            raise web.HTTPError(405)
        self.write_json(await asyncio.to_thread(batches.delete_file, self.ext.jobs.store, file_id))


class BatchesHandler(MLXHandler):
    @web.authenticated
    @authorized
    async def get(self):
        self.write_json(await asyncio.to_thread(batches.list_batches, self.ext.jobs,
                                                self.get_query_argument("limit", None),
                                                self.get_query_argument("after", None)))

    @web.authenticated
    @authorized
    async def post(self):
        self.write_json(await asyncio.to_thread(batches.create_batch, self.ext.jobs, self.request.body))


class BatchHandler(MLXHandler):
    @web.authenticated
    @authorized
    async def get(self, batch_id: str, action: str = None):
        if action:
            raise web.HTTPError(405)
        self.write_json(await asyncio.to_thread(batches.retrieve_batch, self.ext.jobs, batch_id))

    @web.authenticated
    @authorized
    async def post(self, batch_id: str, action: str = None):
        if action != "cancel":
            raise web.HTTPError(405)
        self.write_json(await asyncio.to_thread(batches.cancel_batch, self.ext.jobs, batch_id))
