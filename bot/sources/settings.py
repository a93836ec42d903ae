"""The ``sources.<name>`` section of the config (a public contract, like every key)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

#: What a source's name may look like (it is shown to the model and used in ``channels.*.sources``).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class SourceSettings(BaseModel):
    """One database a channel may be granted: an SQLAlchemy URL and its bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: An SQLAlchemy URL (``postgresql://user:${PASSWORD}@host/db``, ``sqlite:////data/shop.db``,
    #: or any dialect installed). Never shown to the model, the kernel or the chat.
    url: SecretStr
    #: Each query stops after this long (on the server where it can, and in the bot always).
    statement_timeout_s: float = Field(30.0, gt=0, le=3600)
    #: At most this many rows are fetched; the model is told when a result was cut.
    max_rows: int = Field(100_000, ge=1, le=10_000_000)
    #: A result stops once its rows pass this many MB as the database sends them (the thread's
    #: workspace quota also holds); the model is told where and why. One row is at most 4 MB.
    max_result_mb: float = Field(512.0, gt=0, le=100_000)
    #: Told to the model with the source's tables: what the data is about.
    description: str = ""
    #: Queries on this source at once (also its connection pool's size); more wait their turn.
    max_concurrent: int = Field(4, ge=1, le=100)

    @field_validator("url")
    @classmethod
    def _an_sqlalchemy_url(cls, value: SecretStr) -> SecretStr:
        example = "such as postgresql://user:pass@host/db or sqlite:///file.db"
        try:
            url = make_url(value.get_secret_value())
        except (ArgumentError, ValueError):  # its message would quote the URL
            raise ValueError(f"must be an SQLAlchemy URL {example}") from None
        if url.get_backend_name() == "sqlite" and (url.database or ":memory:") == ":memory:":
            raise ValueError("an SQLite source needs a file: sqlite:///path/to/file.db")
        return value
