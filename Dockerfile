# callgate production image: gunicorn (web), Celery worker and beat share it.
# Build: docker build -t callgate .    Run: see docker-compose.yml and README.md.

# --- browser assets from the npm registry (htmx, Chart.js); never from a CDN
FROM node:22-bookworm-slim AS assets
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund

# --- the application
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin callgate
COPY sdk sdk
RUN pip install ./sdk
COPY pyproject.toml README.md ./
# every app of INSTALLED_APPS (and demo/, installed when CALLGATE_DEMO is on)
COPY callgate callgate
COPY reviews reviews
COPY alerts alerts
COPY mcp_gateway mcp_gateway
COPY demo demo
RUN pip install .
COPY manage.py ./
COPY templates templates
COPY static static
COPY --from=assets /src/node_modules/htmx.org/dist node_modules/htmx.org/dist
COPY --from=assets /src/node_modules/chart.js/dist node_modules/chart.js/dist
# Hashed, compressed static files for whitenoise; the key is only for this build step.
RUN DEBUG=false SECRET_KEY=collectstatic-only-not-a-secret python manage.py collectstatic --no-input \
    && chown -R callgate /app
USER callgate
EXPOSE 8000
# callgate/gunicorn.py: Prometheus multiprocess mode (the workers' metrics summed on /metrics)
CMD ["gunicorn", "-c", "python:callgate.gunicorn", "callgate.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--access-logfile", "-", "--logger-class", "callgate.logmask.GunicornLogger"]
