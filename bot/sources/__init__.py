"""Channel data sources: read-only SQL run by the bot, its rows handed to the thread's kernel.

- :mod:`bot.sources.settings`: the ``sources.<name>`` config model.
- :mod:`bot.sources.guard`: one read query, or refused before anything is sent (sqlglot).
- :mod:`bot.sources.engine`: a read-only, bounded, pooled connection per source; streams batches.
- :mod:`bot.sources.parquet`: batches into a Parquet file of the thread's workspace (quota counted).
- :mod:`bot.sources.catalogue`: the tables and columns the model is shown (bounded, cached).
- :mod:`bot.sources.scrub`: credentials out of every message that leaves the bot.
- :mod:`bot.sources.tool`: the model's ``sql`` tool for one turn.

Credentials live only in the bot process: the kernel gets a Parquet file and one line of
code that reads it.
"""
