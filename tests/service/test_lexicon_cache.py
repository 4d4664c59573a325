"""The lexicon cache behind every request (lyre.service.lexicons) on a real PostgreSQL whose table
another session holds locked: a request never waits for the database on the calling thread (the
event loop) once its account's lexicons were read: it gets the copy it had while a worker thread
reads them again."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from lyre.service import lexicons as lexicons_module
from tests.support.postgres import fresh_schema
from tests.support.services import run, service
from tests.text.test_lexicons import PLS


def test_a_request_never_waits_for_a_database_that_hangs_once_its_lexicons_were_read(postgres, monkeypatch):
    url = fresh_schema(postgres.url)

    async def main():
        async with service(**{"voices.database_url": url}) as tts:
            await tts.lexicons.create(PLS, name="brands", default=True, account="acme")
            before = tts.lexicons.aliases("acme", None)
            assert before is not None
            monkeypatch.setattr(lexicons_module, "REFRESH_S", 0.0)  # every request finds its copy stale
            engine = sa.create_engine(url)
            try:
                with engine.connect() as c:  # another session holds the table: any read of it waits
                    tx = c.begin()
                    c.execute(sa.text("LOCK TABLE lexicons IN ACCESS EXCLUSIVE MODE"))
                    got: list = []
                    asking = threading.Thread(target=lambda: got.append(tts.lexicons.aliases("acme", None)))
                    asking.start()
                    asking.join(30)
                    answered_while_locked = not asking.is_alive()
                    tx.rollback()
                asking.join(30)
                assert answered_while_locked and got == [before]  # the copy it had, at once
            finally:
                engine.dispose()

    run(main())
