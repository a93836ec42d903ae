# Threadbook: slim Python, bubblewrap for the kernel sandbox (slirp4netns + iproute2 for
# network: true channels), non-root user; kernels run from /app/.venv-kernel.
# Config and data are volumes: /app/config.yaml (read-only) and /app/data.
#
# Run it with the flags of docs/security.md ("Where you run it"): the seccomp profile
# deploy/container/seccomp.json and systempaths=unconfined, or the bot refuses to start kernels.
#
# BASE_IMAGE: any Debian-based image with Python >= 3.11 at /usr/local/bin/python3 and pip
# (CI builds on a stand-in made with mmdebstrap, tests/container).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}

RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap slirp4netns iproute2 tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 threadbook
WORKDIR /app
# uv (also a dependency of the bot: packages on demand) installs both environments. It trusts
# the system's CA store, as pip does, so a build behind a TLS-inspecting proxy works once the
# proxy's CA is in the base image.
ENV UV_SYSTEM_CERTS=1 UV_NO_CACHE=1 PYTHONUNBUFFERED=1
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check 'uv>=0.13'

# The kernels' own environment (kernels.python's default), before the bot's code so that a code
# change does not rebuild it: the bot's libraries are not in it.
COPY kernels/requirements.txt kernels/requirements.txt
COPY kernels/runtime/pyproject.toml kernels/runtime/pyproject.toml
COPY kernels/runtime/threadbook_kernel kernels/runtime/threadbook_kernel
RUN uv venv --no-python-downloads --python /usr/local/bin/python3 /app/.venv-kernel \
    && uv pip install --compile-bytecode --python /app/.venv-kernel/bin/python -r kernels/requirements.txt ./kernels/runtime

COPY pyproject.toml README.md ./
COPY bot ./bot
COPY kernels ./kernels
COPY adapters ./adapters
COPY bench ./bench
RUN uv pip install --system --compile-bytecode . \
    && mkdir -p /app/data && chown threadbook:threadbook /app/data
COPY config.yaml ./config.yaml

USER threadbook
VOLUME ["/app/data"]
EXPOSE 3000
ENTRYPOINT ["tini", "--"]
CMD ["python", "-m", "bot", "run", "--config", "/app/config.yaml"]
