# Murmur control plane: the API (gunicorn), the control worker, beat and the migrations, one
# image; the `flower` target adds Celery's UI on top of it.
#
#   docker build -f docker/control.Dockerfile -t murmur-control .
#   docker build -f docker/control.Dockerfile --target flower -t murmur-flower .
#
# docker/compose.yaml runs every process from it. It holds no secret: tokens and keys come
# from the environment or from *_FILE paths (Docker secrets) at run time.

FROM python:3.11-slim AS control

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/murmur/venv \
    PATH=/opt/murmur/venv/bin:$PATH

RUN python -m venv /opt/murmur/venv
COPY requirements/control.txt /opt/murmur/requirements/control.txt
RUN pip install --no-cache-dir --upgrade pip \
    && pip install --no-cache-dir -r /opt/murmur/requirements/control.txt

WORKDIR /opt/murmur/app
COPY pyproject.toml setup.cfg README.md alembic.ini ./
COPY migrations ./migrations
COPY app ./app
COPY tasks ./tasks
# The wire contract and shared rules the control plane imports from the worker package
# (finite numbers, broker TLS, queue keys): light modules, no model or torch.
COPY gpu_worker ./gpu_worker
# Editable, so app.migrate finds alembic.ini and migrations/ next to the code; --no-deps
# because every dependency is pinned in requirements/control.txt above.
RUN pip install --no-cache-dir --no-deps -e .

RUN useradd --system --uid 10001 --home-dir /opt/murmur --no-create-home murmur \
    && mkdir -p /var/lib/murmur/audio /var/lib/murmur/beat \
    && chown -R murmur /var/lib/murmur
USER murmur

ENV MURMUR_HOST=0.0.0.0 \
    MURMUR_PORT=8000 \
    MURMUR_STORAGE_PATH=/var/lib/murmur/audio
EXPOSE 8000
CMD ["murmur", "api"]


# Flower 2.2 needs Python >= 3.10 and Celery >= 5.0.5; it runs `celery -A tasks flower`, so
# it reads the same broker settings as the control plane.
FROM control AS flower
USER root
RUN pip install --no-cache-dir flower==2.2.0
USER murmur
EXPOSE 5555
CMD ["celery", "-A", "tasks", "flower", "--port=5555"]
