"""The lexicon copy behind every request (lyre.service.lexicons) on a real PostgreSQL: a lexicon
another replica creates is used here after a refresh the request did not wait for, and while
another session holds the table locked (a database that hangs) a request answers at once from the
copy it has: it never reads the database on the calling thread (the event loop) once its account's
lexicons were read."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from lyre.errors import UnknownLexicon
from lyre.service import lexicons as lexicons_module
from lyre.storage.lexicons import LexiconRegistry
from lyre.text import pls
from tests.support.postgres import fresh_schema
from tests.support.services import run, service
from tests.support.waiting import until_async
from tests.text.test_lexicons import PLS

OTHER = PLS.replace("liar", "lyra")


def test_a_request_uses_the_copy_it_has_while_a_refresh_reads_it_again(postgres, monkeypatch):
    url = fresh_schema(postgres.url)
    monkeypatch.setattr(lexicons_module, "REFRESH_S", 0.05)

    async def main():
        async with service(**{"voices.database_url": url}) as tts:
            await tts.lexicons.create(PLS, name="brands", default=True, account="acme")
            assert tts.lexicons.aliases("acme", None).apply("Lyre") == "liar"
            # another replica adds a default lexicon read before this one (created earlier)
            engine = sa.create_engine(url)
            parsed = pls.parse(OTHER)
            elsewhere = LexiconRegistry(engine, 10).add(
                owner="acme", name="other", language="en-US", pls=OTHER, sha256="0" * 64, aliases=parsed.aliases,
                phonemes=parsed.phonemes, default=True)

            def named() -> object:
                try:
                    return tts.lexicons.aliases("acme", [elsewhere.id])
                except UnknownLexicon:  # (not in this server's copy yet)
                    return None

            seen = await until_async(named, 30, "a refresh to read the other replica's lexicon")
            assert seen.apply("Lyre") == "lyra"
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
                assert answered_while_locked and got and got[0] is not None  # the copy it had, at once
            finally:
                engine.dispose()

    run(main())
