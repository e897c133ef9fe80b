FROM python:3.13-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-client && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY . .
# collectstatic imports the settings, which refuse DEBUG off without encryption keys: a
# throwaway key, generated here and never kept, encrypts nothing at build time.
RUN pip install --no-cache-dir -e . && DEBUG=false SECRET_KEY=build \
    FLOWFORGE_ENCRYPTION_KEYS="$(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')" \
    python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["gunicorn", "flowforge.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--worker-class", "gthread", "--threads", "32"]
