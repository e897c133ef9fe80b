# The browser's DAG drawing (frontend/graph/graph.js with ELK), bundled as `make install` does.
FROM node:20-slim AS graph
WORKDIR /build
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY frontend/graph frontend/graph
RUN npm run build

FROM python:3.13-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-client && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY . .
COPY --from=graph /build/frontend/static/frontend/dist frontend/static/frontend/dist
# tests/, bench/, .git, .venv and var/ stay out of the image (.dockerignore).
# collectstatic runs with DEBUG off, which refuses a short or default SECRET_KEY, a missing
# audit key and missing encryption or secret keys: these throwaway keys exist for the build only (nothing
# is signed or encrypted then); every container gets the real ones from its environment.
RUN pip install --no-cache-dir -e . && \
    DEBUG=false SECRET_KEY=image-build-only-throwaway-key-never-used-by-a-running-service-0123456789 \
    FLOWFORGE_AUDIT_KEYS="build:$(python -c 'import base64,secrets; print(base64.b64encode(secrets.token_bytes(32)).decode())')" \
    FLOWFORGE_ENCRYPTION_KEYS="$(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')" \
    FLOWFORGE_SECRET_KEYS="$(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')" \
    python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["gunicorn", "flowforge.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--worker-class", "gthread", "--threads", "32"]
