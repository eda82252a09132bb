"""OpenAI's fine-tuning jobs routes: thin adapters over mlx_nb.api.fine_tuning (the training
machinery is mlx_nb/training; the extension owns one TrainManager, `ext.training`). Training files
are uploaded through the Files route (purpose "fine-tune")."""

from __future__ import annotations

import asyncio

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_ext.base import MLXHandler
from mlx_nb.api import fine_tuning


class FineTuningJobsHandler(MLXHandler):
    @web.authenticated
    @authorized
    async def get(self):
        self.write_json(await asyncio.to_thread(fine_tuning.list_jobs, self.ext.training,
                                                self.get_query_argument("limit", None),
                                                self.get_query_argument("after", None)))

    @web.authenticated
    @authorized
    async def post(self):
        self.write_json(await asyncio.to_thread(fine_tuning.create_job, self.ext.training, self.ext.jobs.store,
                                                self.request.body))


class FineTuningJobHandler(MLXHandler):
    READS = {None: fine_tuning.retrieve_job, "events": fine_tuning.job_events,
             "checkpoints": fine_tuning.job_checkpoints}

    @web.authenticated
    @authorized
    async def get(self, job_id: str, action: str = None):
        if action not in self.READS:
            raise web.HTTPError(405)
        self.write_json(await asyncio.to_thread(self.READS[action], self.ext.training, job_id))

    @web.authenticated
    @authorized
    async def post(self, job_id: str, action: str = None):
        if action != "cancel":
            raise web.HTTPError(405)
        self.write_json(await asyncio.to_thread(fine_tuning.cancel_job, self.ext.training, job_id))
