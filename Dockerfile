# Threadbook: slim Python, bubblewrap for the kernel sandbox (slirp4netns + iproute2 for
# network: true channels), non-root user; kernels run from /app/.venv-kernel.
# Config and data are volumes: /app/config.yaml (read-only) and /app/data.
FROM python:3.12-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap slirp4netns iproute2 tini \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 threadbook
WORKDIR /app

COPY pyproject.toml README.md ./
COPY bot ./bot
COPY kernels ./kernels
COPY adapters ./adapters
COPY bench ./bench
RUN pip install --no-cache-dir . && mkdir -p /app/data && chown threadbook:threadbook /app/data
# The kernels' own environment (kernels.python's default): the bot's libraries are not in it.
RUN uv venv --no-python-downloads --python /usr/local/bin/python3 /app/.venv-kernel \
    && uv pip install --no-cache --compile-bytecode --python /app/.venv-kernel/bin/python -r kernels/requirements.txt ./kernels/runtime
COPY config.yaml ./config.yaml

USER threadbook
ENV PYTHONUNBUFFERED=1
VOLUME ["/app/data"]
EXPOSE 3000
ENTRYPOINT ["tini", "--"]
CMD ["python", "-m", "bot", "run", "--config", "/app/config.yaml"]
