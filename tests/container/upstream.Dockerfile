# The upstream service of compose.yaml: the project's fixture MCP server over streamable HTTP.
# Build context: the repository root (`docker build -f tests/container/upstream.Dockerfile .`).
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

WORKDIR /app
COPY requirements.lock ./
# Only the MCP SDK (and what it needs), at the versions the lock pins.
RUN pip install -c requirements.lock mcp \
    && useradd --system --uid 10002 --no-create-home upstream
COPY tests/fixtures/upstream.py ./upstream.py

USER 10002
EXPOSE 9000
ENTRYPOINT ["python", "upstream.py", "--transport", "http", "--host", "0.0.0.0"]
CMD ["--port", "9000", "--name", "web"]
