"""The SQLite schema before Alembic: ``PRAGMA user_version`` 1 to 3, each a list of statements.

A database written by those versions is brought to version 3 with the statements below and
then stamped with Alembic's first revision (``0001``), whose tables are exactly version 3's.
"""

from __future__ import annotations

#: Migration ``i`` brought the schema to version ``i + 1``.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE threads (
            key TEXT PRIMARY KEY,
            channel_key TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_active_at REAL NOT NULL,
            last_seq INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            thread TEXT NOT NULL REFERENCES threads(key) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            user_id TEXT,
            created_at REAL NOT NULL,
            UNIQUE (thread, seq)
        )""",
        """CREATE TABLE cells (
            id INTEGER PRIMARY KEY,
            thread TEXT NOT NULL REFERENCES threads(key) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            code TEXT NOT NULL,
            outputs TEXT NOT NULL,
            execution_count INTEGER,
            outcome TEXT NOT NULL,
            duration_s REAL NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (thread, seq)
        )""",
        """CREATE TABLE processed (
            message_id TEXT PRIMARY KEY,
            at REAL NOT NULL
        )""",
        "CREATE INDEX processed_at ON processed (at)",
        """CREATE TABLE usage (
            id INTEGER PRIMARY KEY,
            thread TEXT NOT NULL,
            model TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            at REAL NOT NULL
        )""",
        "CREATE INDEX usage_thread ON usage (thread)",
    ),
    (
        """CREATE TABLE turns_in_flight (
            thread TEXT NOT NULL,
            message_id TEXT NOT NULL,
            run TEXT NOT NULL,
            started_at REAL NOT NULL,
            PRIMARY KEY (thread, message_id)
        )""",
    ),
    (
        # Our own notices were stored as assistant messages; they became ``notice`` rows.
        """UPDATE messages SET role = 'notice', content = json_set(content, '$.role', 'notice')
        WHERE role = 'assistant' AND json_extract(content, '$.tool_calls') IS NULL AND (
            (json_extract(content, '$.content') LIKE 'The language model %' AND (
                json_extract(content, '$.content') LIKE '%please try again.'
                OR json_extract(content, '$.content') LIKE '%please try again later.'
                OR json_extract(content, '$.content') LIKE '%please try again in a minute.'
                OR json_extract(content, '$.content') LIKE '%should check llm.%'
                OR json_extract(content, '$.content') LIKE 'The language model refused the request (HTTP %).'))
            OR json_extract(content, '$.content') LIKE 'The Python kernel for this thread failed: %'
            OR json_extract(content, '$.content') LIKE '!_Stopped on request after %' ESCAPE '!'
            OR json_extract(content, '$.content') LIKE '!_Stopped after %, the limit for one message.%' ESCAPE '!'
            OR json_extract(content, '$.content') = '_(The model gave an empty answer.)_'
        )""",
    ),
)

#: The last version of the pre-Alembic schema; Alembic's ``0001`` is this schema.
LAST_VERSION = len(MIGRATIONS)
