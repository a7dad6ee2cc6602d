# Image for the api, worker and beat services of docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# OCR of scanned pages and page images (shared/parsing/ocr.py)
RUN apt-get update && apt-get install -y --no-install-recommends tesseract-ocr \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md alembic.ini ./
COPY services services
COPY workers workers
COPY shared shared
COPY migrations migrations
# the typed client, which the MCP server's tools call the API through (services/mcp)
COPY clients/python clients/python
RUN pip install ./clients/python .
EXPOSE 8000
CMD ["uvicorn", "services.api.app:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000"]
