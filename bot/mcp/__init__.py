"""A channel's MCP servers: tools of other systems the model may call, called by the bot.

- :mod:`bot.mcp.settings`: the ``mcp.<name>`` config model.
- :mod:`bot.mcp.connection`: one shared client session per server (streamable HTTP or stdio),
  reconnected when it drops.
- :mod:`bot.mcp.registry`: every server, connected at start, watched, closed at shutdown; which
  tools are offered.
- :mod:`bot.mcp.names`: the ``<server>__<tool>`` function names the model sees.
- :mod:`bot.mcp.result`: a result as the model's tool message, what is large or not text saved
  into the workspace.
- :mod:`bot.mcp.hiding`: the servers' credentials out of every text the bot passes on.
- :mod:`bot.mcp.tool`: an offered tool for one turn (the agent loop's ``Tool``).
- :mod:`bot.mcp.cell`: how a call looks in the exported notebook.

Credentials (URL, headers, a stdio server's environment) live only in the bot process: the
kernel gets files, the model text, neither a credential.
"""
